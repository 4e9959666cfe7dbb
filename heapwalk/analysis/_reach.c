/* The leak scan's breadth-first search in C, loaded with ctypes by heapwalk/analysis/graph.py.
 *
 * A plain loop over arrays numpy owns: no Python objects, no Python.h.  graph.py holds the same search in
 * numpy, used when this library was not built; the tests hold the two equal.
 */

#include <stdint.h>

/* Visits every node reachable from the NSEEDS nodes of SEEDS along the edges of a graph in compressed rows
 * (node v's edges lead to TARGETS[OFFSETS[v]] .. TARGETS[OFFSETS[v + 1] - 1]), skipping the nodes SEEN
 * marks and marking those it visits.  A node reached along an edge gets the node it came from in PARENT; a
 * seed keeps its PARENT.  ORDER (room for every node) receives the nodes visited, seeds first; returns how
 * many. */
int64_t hw_reach(const int64_t *offsets, const int32_t *targets, const int32_t *seeds, int64_t nseeds,
                 uint8_t *seen, int32_t *parent, int32_t *order)
{
    int64_t head = 0, tail = 0;
    for (int64_t i = 0; i < nseeds; i++) {
        int32_t s = seeds[i];
        if (!seen[s]) {
            seen[s] = 1;
            order[tail++] = s;
        }
    }
    while (head < tail) {
        int32_t v = order[head++];
        for (int64_t e = offsets[v]; e < offsets[v + 1]; e++) {
            int32_t t = targets[e];
            if (!seen[t]) {
                seen[t] = 1;
                parent[t] = v;
                order[tail++] = t;
            }
        }
    }
    return tail;
}
