/* The leak scan's breadth-first search in C, loaded with ctypes by heapwalk/analysis/graph.py.
 *
 * A plain loop over arrays numpy owns: no Python objects, no Python.h.  graph.py holds the same search in
 * numpy, used when this library was not built; the tests hold the two equal.
 */

#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* The version of these functions' arguments (9: hw_scan_rows gives the first word of each block starting in its
 * window; 8: it passes by the blocks followed before; 7: it judges
 * a window ROOM words at a time; 6: the lookup's table written packed, hw_table_packed; 5: the blocks' ends or
 * lengths, end_of; the tally's groups of any width, and sizes from lengths; the lookup's table packed, entry): a
 * library built from older sources has another, or none, and is not used. */
int64_t hw_reach_abi(void)
{
    return 9;
}

/* Goes on with a breadth-first search whose queue is ORDER[HEAD .. TAIL): visits every node the queued ones lead
 * to along the edges (node v's lead to TARGETS[OFFSETS[v]] .. TARGETS[OFFSETS[v + 1] - 1]), skipping the nodes
 * SEEN marks and marking those it visits, each with the node it came from in PARENT.  Returns the queue's end. */
static int64_t spread(const int64_t *offsets, const int32_t *targets, uint8_t *seen, int32_t *parent,
                      int32_t *order, int64_t head, int64_t tail)
{
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

/* Visits every node reachable from the NSEEDS nodes of SEEDS along the edges of a graph in compressed rows
 * (see spread), skipping the nodes SEEN marks and marking those it visits.  A node reached along an edge gets
 * the node it came from in PARENT; a seed keeps its PARENT.  ORDER (room for every node) receives the nodes
 * visited, seeds first; returns how many. */
int64_t hw_reach(const int64_t *offsets, const int32_t *targets, const int32_t *seeds, int64_t nseeds,
                 uint8_t *seen, int32_t *parent, int32_t *order)
{
    int64_t tail = 0;
    for (int64_t i = 0; i < nseeds; i++) {
        int32_t s = seeds[i];
        if (!seen[s]) {
            seen[s] = 1;
            order[tail++] = s;
        }
    }
    return spread(offsets, targets, seen, parent, order, 0, tail);
}

/* hw_reach from the seeds MARKS names among the N nodes: each node v whose MARKS[v] is 0 or more, in order,
 * its PARENT set to -1. */
int64_t hw_reach_marked(const int64_t *offsets, const int32_t *targets, const int32_t *marks, int64_t n,
                        uint8_t *seen, int32_t *parent, int32_t *order)
{
    int64_t tail = 0;
    for (int64_t v = 0; v < n; v++) {
        if (marks[v] < 0)
            continue;
        parent[v] = -1;
        if (!seen[v]) {
            seen[v] = 1;
            order[tail++] = (int32_t)v;
        }
    }
    return spread(offsets, targets, seen, parent, order, 0, tail);
}

/* The slot of the table (see hw_locate) value V falls in, or -1 when it lies outside every stretch. */
static inline int64_t slot_of(uint64_t v, const uint64_t *lo, const int64_t *slots, const int64_t *first,
                              int64_t nheaps, int64_t shift)
{
    if (nheaps == 0 || v < lo[0])
        return -1;
    const uint64_t *at = lo;                  /* the last stretch whose start is at or below v: in [at, at + n) */
    for (int64_t n = nheaps; n > 1; n -= n / 2)
        at = at[n / 2] <= v ? at + n / 2 : at;    /* no branch: the values fall in the stretches at random */
    int64_t a = at - lo;
    uint64_t s = (v - lo[a]) >> shift;
    return s < (uint64_t)slots[a] ? first[a] + (int64_t)s : -1;
}

/* The end of block I: ENDS[I], or where ENDS is NULL its start and LENGTHS[I] units of 8 bytes (view.Blocks). */
static inline uint64_t end_of(const uint64_t *starts, const uint64_t *ends, const uint32_t *lengths, int64_t i)
{
    return ends ? ends[i] : starts[i] + ((uint64_t)lengths[i] << 3);
}

/* Slots whose entries share one base in a packed table (see entry) */
#define GROUP_SHIFT 5

/* Entry T of the table (see hw_locate): TABLE[T] where NBASES is 0; else the table is packed, NBASES int32 bases
 * (one for each 1 << GROUP_SHIFT entries: the entry of the group's first) followed by a uint16 for each entry,
 * its distance from its group's base (hw_table_packed). */
static inline int64_t entry(const int32_t *table, int64_t nbases, int64_t t)
{
    if (!nbases)
        return table[t];
    return table[t >> GROUP_SHIFT] + ((const uint16_t *)(table + nbases))[t];
}

/* Where entry T lies, to fetch it ahead */
static inline const void *entry_at(const int32_t *table, int64_t nbases, int64_t t)
{
    return nbases ? (const void *)((const uint16_t *)(table + nbases) + t) : (const void *)(table + t);
}

/* Words looked up ahead of the one being answered: their table entries, then their blocks' bounds, are
 * fetched from memory meanwhile (the lookups go anywhere in tables of tens of megabytes) */
#define AHEAD 16
#define RING 32

/* For each of the N values of VALUES, the block it points into (OUT: its index, or -1): the last block whose start
 * is at or below the value, when the value is below that block's end.  STARTS (sorted) and ENDS (or, where ENDS is
 * NULL, LENGTHS: see end_of) are the blocks'.  The search starts from a table: the memory [LO[h], LO[h] +
 * (SLOTS[h] << SHIFT)) of each of the NHEAPS stretches that hold the blocks (sorted, apart) is cut into slots of 1
 * << SHIFT bytes, and TABLE[FIRST[h] + s] holds the last block starting at or below slot s's start (-1: none); the
 * table has one entry more, past the last slot, holding the last block; it is packed where NBASES is not 0 (see
 * entry).  A value outside every stretch is -1 at once; one inside is searched for between its slot's entry and the
 * next one's. */
static void locate_part(const uint64_t *values, int64_t n, const uint64_t *starts, const uint64_t *ends,
                        const uint32_t *lengths, const uint64_t *lo, const int64_t *slots, const int64_t *first,
                        int64_t nheaps, const int32_t *table, int64_t nbases, int64_t shift, int32_t *out)
{
    int64_t ring[RING];
    for (int64_t k = 0; k < AHEAD && k < n; k++) {
        ring[k % RING] = slot_of(values[k], lo, slots, first, nheaps, shift);
        if (ring[k % RING] >= 0)
            __builtin_prefetch(entry_at(table, nbases, ring[k % RING]));
    }
    for (int64_t k = 0; k < n; k++) {
        int64_t ahead = k + AHEAD;
        if (ahead < n) {
            int64_t t = slot_of(values[ahead], lo, slots, first, nheaps, shift);
            ring[ahead % RING] = t;
            if (t >= 0)
                __builtin_prefetch(entry_at(table, nbases, t));
        }
        int64_t half = k + AHEAD / 2;
        if (half < n && ring[half % RING] >= 0) {
            int64_t h = entry(table, nbases, ring[half % RING]);
            if (h >= 0) {
                __builtin_prefetch(&starts[h]);
                if (ends)
                    __builtin_prefetch(&ends[h]);
                else
                    __builtin_prefetch(&lengths[h]);
            }
        }
        uint64_t v = values[k];
        int64_t t = ring[k % RING];
        out[k] = -1;
        if (t < 0)
            continue;
        int64_t i = entry(table, nbases, t), len = entry(table, nbases, t + 1) - i;   /* in [i, i + len] */
        while (len > 0) {                         /* the last starting at or below v: no branch on the values */
            int64_t step = (len + 1) / 2;         /* (a branch there missed one time in two: 10 ns a lookup) */
            i = starts[i + step] <= v ? i + step : i;
            len -= step;
        }
        out[k] = i >= 0 && v < end_of(starts, ends, lengths, i) ? (int32_t)i : -1;
    }
}

/* One part of a lookup (hw_locate's arguments), for a thread of its own */
struct locate_job {
    const uint64_t *values, *starts, *ends, *lo;
    const uint32_t *lengths;
    const int64_t *slots, *first;
    const int32_t *table;
    int64_t n, nheaps, nbases, shift;
    int32_t *out;
};

static void *locate_job_run(void *arg)
{
    struct locate_job *j = arg;
    locate_part(j->values, j->n, j->starts, j->ends, j->lengths, j->lo, j->slots, j->first, j->nheaps, j->table,
                j->nbases, j->shift, j->out);
    return NULL;
}

/* Values a lookup takes before it is shared between threads (a thread costs tens of microseconds to make, 4,096
 * lookups about 150: a scan's window looks up some 16,000 words, and sharing from 16,384 on made a report on
 * three million blocks 0.1 s slower), and the most threads it is shared between: each lookup waits on memory (a
 * table and the blocks' bounds anywhere in tens of megabytes), and a core has room for only a few such waits at
 * once, so that a second core answers about as many again */
#define PARALLEL_FROM 4096
#define MAX_THREADS 4

/* The threads a lookup may take: the CPUs this process may run on, at most MAX_THREADS, or HEAPWALK_THREADS
 * (1: none but the caller's) */
static int64_t lookup_threads(void)
{
    static int64_t known;
    if (known)
        return known;
    int64_t n = 1;
    const char *said = getenv("HEAPWALK_THREADS");
    cpu_set_t cpus;
    if (said && atoi(said) > 0)
        n = atoi(said);
    else if (sched_getaffinity(0, sizeof cpus, &cpus) == 0)
        n = CPU_COUNT(&cpus);
    known = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
    return known;
}

/* locate_part's lookup (its arguments, and NBLOCKS, the blocks' count), shared between threads when it is long:
 * parts of VALUES, each answered in OUT as the whole would be.  The threads are made with every signal blocked
 * (gdb's handlers are for its own thread), and joined before it returns; a part whose thread cannot be made is
 * answered here. */
void hw_locate(const uint64_t *values, int64_t n, const uint64_t *starts, const uint64_t *ends,
               const uint32_t *lengths, int64_t nblocks,
               const uint64_t *lo, const int64_t *slots, const int64_t *first, int64_t nheaps,
               const int32_t *table, int64_t nbases, int64_t shift, int32_t *out)
{
    (void)nblocks;
    int64_t parts = n / PARALLEL_FROM + 1, threads = lookup_threads();
    if (parts > threads)
        parts = threads;
    struct locate_job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    sigset_t all, old;
    if (parts > 1) {
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
    }
    for (int64_t p = 1; p < parts; p++) {
        int64_t a = n * p / parts, b = n * (p + 1) / parts;
        jobs[p] = (struct locate_job){values + a, starts, ends, lo, lengths, slots, first, table, b - a, nheaps,
                                      nbases, shift, out + a};
        started[p] = pthread_create(&ids[p], NULL, locate_job_run, &jobs[p]) == 0;
    }
    if (parts > 1)
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    int64_t upto = parts > 1 ? n / parts : n;
    locate_part(values, upto, starts, ends, lengths, lo, slots, first, nheaps, table, nbases, shift, out);
    for (int64_t p = 1; p < parts; p++) {
        if (started[p])
            pthread_join(ids[p], NULL);
        else
            locate_job_run(&jobs[p]);
    }
}

/* The table hw_locate starts from: for each slot of the NHEAPS stretches (the slot s of stretch h starting at
 * LO[h] + (s << SHIFT), SLOTS[h] of them, in order), the last of the NSTARTS block starts STARTS (ascending)
 * at or below the slot's start, -1 where none, into TABLE; one walk through both. */
void hw_table(const uint64_t *lo, const int64_t *slots, int64_t nheaps, int64_t shift, const uint64_t *starts,
              int64_t nstarts, int32_t *table)
{
    int64_t i = -1, k = 0;
    for (int64_t h = 0; h < nheaps; h++) {
        for (int64_t s = 0; s < slots[h]; s++) {
            uint64_t at = lo[h] + ((uint64_t)s << shift);
            while (i + 1 < nstarts && starts[i + 1] <= at)
                i++;
            table[k++] = (int32_t)i;
        }
    }
}

/* hw_table's entries, and the one past them (the last block), written packed into OUT as `entry` reads them: (N
 * >> GROUP_SHIFT) + 1 bases, then a uint16 an entry, N the slots and one.  Returns 0, or -1 when an entry lies
 * 65,535 or more past its group's base (OUT is then of no use: the caller makes the table whole, hw_table). */
int64_t hw_table_packed(const uint64_t *lo, const int64_t *slots, int64_t nheaps, int64_t shift,
                        const uint64_t *starts, int64_t nstarts, int32_t *out, int64_t n)
{
    int64_t nbases = (n >> GROUP_SHIFT) + 1, i = -1, t = 0;
    uint16_t *deltas = (uint16_t *)(out + nbases);
    for (int64_t h = 0; h <= nheaps; h++) {
        int64_t count = h < nheaps ? slots[h] : 1;
        for (int64_t s = 0; s < count; s++, t++) {
            if (h < nheaps) {
                uint64_t at = lo[h] + ((uint64_t)s << shift);
                while (i + 1 < nstarts && starts[i + 1] <= at)
                    i++;
            } else {
                i = nstarts - 1;
            }
            if (!(t & ((1 << GROUP_SHIFT) - 1)))
                out[t >> GROUP_SHIFT] = (int32_t)i;
            int64_t d = i - out[t >> GROUP_SHIFT];
            if (d > 65535)
                return -1;
            deltas[t] = (uint16_t)d;
        }
    }
    return 0;
}

/* For each of the NPAGES pages of 512 words from WORDS, whether it holds any word but zero (OUT: 1 or 0); a
 * page that does stops being read at its first such word. */
void hw_nonzero_pages(const uint64_t *words, int64_t npages, uint8_t *out)
{
    for (int64_t p = 0; p < npages; p++) {
        const uint64_t *page = words + 512 * p;
        uint64_t any = 0;
        for (int64_t i = 0; i < 512 && !any; i += 8)      /* a cache line at a time, without a branch inside */
            any = page[i] | page[i + 1] | page[i + 2] | page[i + 3] | page[i + 4] | page[i + 5] | page[i + 6] |
                  page[i + 7];
        out[p] = any != 0;
    }
}

/* hw_locate for VALUES in ascending order: one walk through them and the blocks together, from the block
 * FROM (the last starting at or below the first value, -1 for none). */
void hw_locate_sorted(const uint64_t *values, int64_t n, const uint64_t *starts, const uint64_t *ends,
                      const uint32_t *lengths, int64_t nblocks, int64_t from, int32_t *out)
{
    int64_t i = from;
    for (int64_t k = 0; k < n; k++) {
        uint64_t v = values[k];
        while (i + 1 < nblocks && starts[i + 1] <= v)
            i++;
        out[k] = i >= 0 && v < end_of(starts, ends, lengths, i) ? (int32_t)i : -1;
    }
}

/* For each of the N words at WORD whose block is BLOCK, all in the root ROOT: the first word met for each block,
 * kept in HIT_WORD (when not NULL) and HIT_ROOT where the block had none yet (HIT_ROOT below 0).  Without
 * HIT_ROOT (NULL), each block is only marked in SEEN. */
void hw_first_hits(const int32_t *block, const uint64_t *word, int64_t n, int32_t root, uint64_t *hit_word,
                   int32_t *hit_root, uint8_t *seen)
{
    for (int64_t k = 0; k < n; k++) {
        int32_t b = block[k];
        if (!hit_root) {
            seen[b] = 1;
        } else if (hit_root[b] < 0) {
            hit_root[b] = root;
            if (hit_word)
                hit_word[b] = word[k];
        }
    }
}

/* A window of a root: of the N words WORDS read from BASE, each whose value lies in [LO, HI) and points into a
 * block (hw_locate, with STARTS, ENDS, LENGTHS, NBLOCKS and the table TLO, SLOTS, FIRST, NHEAPS, TABLE, NBASES,
 * SHIFT) is a hit of the root ROOT, kept as hw_first_hits keeps it (the word's address to HIT_WORD, when not NULL;
 * SEEN marked instead where HIT_ROOT is NULL).  VALUES, INDEX and BLOCK (room for N each) hold the words in [LO,
 * HI) meanwhile; returns how many words hit a block. */
int64_t hw_root_window(const uint64_t *words, int64_t n, uint64_t base, uint64_t lo, uint64_t hi,
                       const uint64_t *starts, const uint64_t *ends, const uint32_t *lengths, int64_t nblocks,
                       const uint64_t *tlo,
                       const int64_t *slots, const int64_t *first, int64_t nheaps, const int32_t *table,
                       int64_t nbases, int64_t shift, int32_t root, uint64_t *hit_word, int32_t *hit_root,
                       uint8_t *seen,
                       uint64_t *values, int64_t *index, int32_t *block)
{
    int64_t m = 0, hits = 0;
    for (int64_t k = 0; k < n; k++) {
        uint64_t w = words[k];
        if (w < lo || w >= hi)
            continue;
        values[m] = w;
        index[m++] = k;
    }
    hw_locate(values, m, starts, ends, lengths, nblocks, tlo, slots, first, nheaps, table, nbases, shift,
              block);
    for (int64_t k = 0; k < m; k++) {
        int32_t b = block[k];
        if (b < 0)
            continue;
        hits++;
        if (!hit_root) {
            seen[b] = 1;
        } else if (hit_root[b] < 0) {
            hit_root[b] = root;
            if (hit_word)
                hit_word[b] = base + 8 * (uint64_t)index[k];
        }
    }
    return hits;
}

/* The rows of a scan's batch (see hw_scan_rows): the M values VALUES of words inside the blocks SOURCE names
 * looked up (into BLOCK), and each that points into another block judged; returns the edges appended to TARGETS
 * (from COUNT on) and adds the rows begun to *NK. */
static int64_t judge(const uint64_t *values, int64_t m, const uint64_t *starts, const uint64_t *ends,
                     const uint32_t *lengths, int64_t nblocks, const uint64_t *tlo, const int64_t *slots,
                     const int64_t *first, int64_t nheaps, const int32_t *table, int64_t nbases, int64_t shift,
                     int32_t *block, const int32_t *source, uint8_t *seen, int64_t defer, int64_t edges_before,
                     int32_t *targets, int64_t count, int32_t *keys, int64_t *row_starts, int64_t *nk, int64_t *last)
{
    hw_locate(values, m, starts, ends, lengths, nblocks, tlo, slots, first, nheaps, table, nbases, shift, block);
    for (int64_t k = 0; k < m; k++) {
        int32_t s = source[k], t = block[k];
        if (t < 0 || t == s)
            continue;
        if (defer && seen[s]) {
            seen[t] = 1;
            continue;
        }
        if (s != *last) {
            keys[*nk] = s;
            row_starts[(*nk)++] = edges_before + count;
            *last = s;
        }
        targets[count++] = t;
    }
    return count;
}

/* The leak scan's pass over a window of the N words WORDS read from BASE (8-aligned), one window at a time in
 * address order after the roots: each word that lies inside one of the NBLOCKS blocks STARTS and ENDS or LENGTHS
 * (sorted by start; from the block FROM, the last starting at or below BASE, -1 for none: the words of each block
 * met are read, those between blocks never), whose value lies in [LO, HI) and points into another block (hw_locate,
 * with the table TLO, SLOTS, FIRST, NHEAPS, TABLE, NBASES, SHIFT) is an edge, judged as it comes: ROOM words at a
 * time (VALUES, BLOCK and SOURCE, room for ROOM each, hold them meanwhile).  With DEFER set, a block SEEN already
 * marks the blocks its words point into (SEEN set) and keeps none of its edges; the others' edges (every block's,
 * DEFER clear) are kept as rows: each edge's target appended to TARGETS (room for N), and each block whose row
 * starts here (not *LAST, the block of the edge kept before) appended to KEYS with its first edge's place,
 * EDGES_BEFORE + the edges appended here before it, to ROW_STARTS (room for N each; *NKEYS counts those appended).
 * A block seen only after its words were read has its row to be followed then: hw_close.  The NFOLLOWED blocks
 * FOLLOWED (ascending) are passed by: their words were followed before (a container read whole, seen, its
 * blocks marked).  Where FIRSTS is not NULL (room for N), the first word of each block whose first word lies in
 * the window, followed or not, is written there, and the first such block's index to *FIRST_BLOCK (those blocks
 * are consecutive); *NFIRSTS counts them.  Returns the edges appended. */
int64_t hw_scan_rows(const uint64_t *words, int64_t n, uint64_t base, uint64_t lo, uint64_t hi,
                     const uint64_t *starts, const uint64_t *ends, const uint32_t *lengths, int64_t nblocks,
                     int64_t from,
                     const uint64_t *tlo, const int64_t *slots, const int64_t *first, int64_t nheaps,
                     const int32_t *table, int64_t nbases, int64_t shift, uint64_t *values, int32_t *block,
                     int32_t *source, int64_t room,
                     uint8_t *seen, int64_t defer, int64_t edges_before, int32_t *targets, int32_t *keys,
                     int64_t *row_starts, int64_t *nkeys, int64_t *last, const int32_t *followed,
                     int64_t nfollowed, uint64_t *firsts, int64_t *first_block, int64_t *nfirsts)
{
    int64_t m = 0, count = 0, nk = 0, x = 0, nf = 0;
    uint64_t past = base + 8 * (uint64_t)n, span = hi > lo ? hi - lo : 0;
    while (x < nfollowed && followed[x] < from)
        x++;
    for (int64_t i = from < 0 ? 0 : from; i < nblocks && starts[i] < past; i++) {
        if (firsts && starts[i] >= base && starts[i] + 8 <= past) {
            if (!nf)
                *first_block = i;
            firsts[nf++] = words[(starts[i] - base) / 8];
        }
        while (x < nfollowed && followed[x] < i)
            x++;
        if (x < nfollowed && followed[x] == i)
            continue;
        uint64_t end = end_of(starts, ends, lengths, i);
        if (i + 1 < nblocks && starts[i + 1] < end)
            end = starts[i + 1];
        if (end <= base)
            continue;
        int64_t k = starts[i] > base ? (int64_t)((starts[i] - base + 7) / 8) : 0;
        int64_t stop = end < past ? (int64_t)((end - base + 7) / 8) : n;
        while (k < stop) {
            int64_t upto = k + (room - m) < stop ? k + (room - m) : stop;
            for (; k < upto; k++) {              /* without a branch: a heap's words point into it at random */
                uint64_t w = words[k];
                values[m] = w;
                source[m] = (int32_t)i;
                m += w - lo < span;
            }
            if (m == room) {
                count = judge(values, m, starts, ends, lengths, nblocks, tlo, slots, first, nheaps, table, nbases,
                              shift, block, source, seen, defer, edges_before, targets, count, keys, row_starts,
                              &nk, last);
                m = 0;
            }
        }
    }
    count = judge(values, m, starts, ends, lengths, nblocks, tlo, slots, first, nheaps, table, nbases, shift,
                  block, source, seen, defer, edges_before, targets, count, keys, row_starts, &nk, last);
    *nkeys = nk;
    if (nfirsts)
        *nfirsts = nf;
    return count;
}

/* Where node V's row is among the NKEYS rows KEYS (ascending) names, or -1. */
static int64_t row_of(const int32_t *keys, int64_t nkeys, int32_t v)
{
    int64_t a = 0, b = nkeys;
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (keys[m] < v)
            a = m + 1;
        else
            b = m;
    }
    return a < nkeys && keys[a] == v ? a : -1;
}

/* The closure of the reach over the rows hw_scan_rows kept: the NKEYS nodes KEYS (ascending), node KEYS[k]
 * leading to TARGETS[ROW_STARTS[k] .. ROW_STARTS[k + 1]).  Every node SEEN marks leads to the nodes its row
 * names, and they to theirs; each is marked in SEEN.  ORDER (room for NKEYS) is the queue of rows; returns how
 * many nodes were marked here. */
int64_t hw_close(const int32_t *keys, const int64_t *row_starts, int64_t nkeys, const int32_t *targets,
                 uint8_t *seen, int64_t *order)
{
    int64_t head = 0, tail = 0, marked = 0;
    for (int64_t k = 0; k < nkeys; k++)
        if (seen[keys[k]])
            order[tail++] = k;
    while (head < tail) {
        int64_t k = order[head++];
        for (int64_t e = row_starts[k]; e < row_starts[k + 1]; e++) {
            int32_t t = targets[e];
            if (!seen[t]) {
                seen[t] = 1;
                marked++;
                int64_t r = row_of(keys, nkeys, t);
                if (r >= 0)
                    order[tail++] = r;
            }
        }
    }
    return marked;
}

/* Two runs of blocks merged in address order, less those that start at one of the NX values of EXCLUDED
 * (ascending): run A (NA blocks: A_START, A_END, A_ARENA) and run B (NB), each strictly ascending by start, into
 * START, END and ARENA (room for NA + NB).  Returns how many, or -1 when the merged starts are not strictly
 * ascending (a run out of order, or a start in both: only damage does that, and the caller then sorts). */
int64_t hw_merge_blocks(const uint64_t *a_start, const uint64_t *a_end, const int32_t *a_arena, int64_t na,
                        const uint64_t *b_start, const uint64_t *b_end, const int32_t *b_arena, int64_t nb,
                        const uint64_t *excluded, int64_t nx, uint64_t *start, uint64_t *end, int32_t *arena)
{
    int64_t i = 0, j = 0, x = 0, count = 0;
    uint64_t last = 0;
    while (i < na || j < nb) {
        int from_a = j >= nb || (i < na && a_start[i] < b_start[j]);
        uint64_t at = from_a ? a_start[i] : b_start[j];
        if (i + j > 0 && at <= last)
            return -1;
        last = at;
        while (x < nx && excluded[x] < at)
            x++;
        if (x >= nx || excluded[x] != at) {
            start[count] = at;
            end[count] = from_a ? a_end[i] : b_end[j];
            arena[count] = from_a ? a_arena[i] : b_arena[j];
            count++;
        }
        if (from_a)
            i++;
        else
            j++;
    }
    return count;
}

/* Whether the word W (as stored: little-endian) holds text: its first four bytes printable ASCII (0x20 to 0x7e),
 * each of the other four printable or zero. */
static inline uint8_t is_text(uint64_t w)
{
    uint8_t ok = 1;
    for (int b = 0; b < 8 && ok; b++) {
        uint8_t c = (uint8_t)(w >> (8 * b));
        ok = (c >= 0x20 && c <= 0x7e) || (b >= 4 && c == 0);
    }
    return ok;
}

/* Whether each of the N WORDS holds text (is_text); 1 or 0 into OUT. */
void hw_text_words(const uint64_t *words, int64_t n, uint8_t *out)
{
    for (int64_t k = 0; k < n; k++)
        out[k] = is_text(words[k]);
}

/* The last of the N sorted VALUES at or below V, as an index (-1: none). */
static inline int64_t last_at_or_below(const uint64_t *values, int64_t n, uint64_t v)
{
    int64_t at = -1, len = n;                 /* the answer lies in [at, at + len]; no branch on the values */
    while (len > 0) {
        int64_t step = (len + 1) / 2;
        at = values[at + step] <= v ? at + step : at;
        len -= step;
    }
    return at;
}

/* Each of the N first WORDS' signature into OUT (see leaks.signatures): the word itself when it lies in the
 * read-only range [STARTS[i], ENDS[i]) of the last of the NIMAGES (sorted by start) starting at or below it and
 * is none of the NLOADS load addresses LOADS (sorted); else 1 when it holds text; else 0. */
void hw_signatures(const uint64_t *words, int64_t n, const uint64_t *starts, const uint64_t *ends, int64_t nimages,
                   const uint64_t *loads, int64_t nloads, uint64_t *out)
{
    uint64_t gap = 0, wide = 0, reach = 0;   /* the widest stretch no image holds, [gap, gap + wide): the heaps */
    for (int64_t i = 0; i <= nimages; i++) { /* lie there, and most first words point into them */
        uint64_t next = i < nimages ? starts[i] : UINT64_MAX;
        if (next > reach && next - reach > wide) {
            gap = reach;
            wide = next - reach;
        }
        if (i < nimages && ends[i] > reach)
            reach = ends[i];
    }
    for (int64_t k = 0; k < n; k++) {
        uint64_t w = words[k];
        if (w - gap < wide) {
            out[k] = is_text(w);
            continue;
        }
        int64_t i = nimages ? last_at_or_below(starts, nimages, w) : -1;
        if (i >= 0 && w < ends[i]) {
            int64_t j = last_at_or_below(loads, nloads, w);
            if (j < 0 || loads[j] != w) {
                out[k] = w;
                continue;
            }
        }
        out[k] = is_text(w);
    }
}

/* The power-of-two bucket of SIZE: the exponent of SIZE as a double holds it (its low end), 5 at least. */
static inline int64_t size_exponent(int64_t size)
{
    if (size < 32)
        return 5;
    double d = (double)size;
    uint64_t bits;
    memcpy(&bits, &d, 8);
    return (int64_t)(bits >> 52) - 1023;
}

/* GROUP[K], of WIDTH bytes: uint8, uint16 or int32 (view.Blocks.arena_index) */
static inline int64_t group_at(const void *group, int64_t width, int64_t k)
{
    return width == 1 ? ((const uint8_t *)group)[k] : width == 2 ? ((const uint16_t *)group)[k]
                                                                 : ((const int32_t *)group)[k];
}

/* N blocks counted and summed by a key: GROUP[k] (group_at; 0 when GROUP is NULL), or with BY_EXPONENT GROUP[k] * 64
 * plus the bucket of SIZES[k] (size_exponent; where SIZES is NULL, (LENGTHS[k] << SHIFT) + ADJUST: view.BlockSizes).  Each block adds one to COUNTS[key] and its size to BYTES[key], and when
 * LEAKED (may be NULL) marks it, to GONE[key] and GONE_BYTES[key] as well; the four hold zeros on entry, and room
 * for every key. */
void hw_tally(const void *group, int64_t width, const int64_t *sizes, const uint32_t *lengths, int64_t shift,
              int64_t adjust, const uint8_t *leaked, int64_t n, int64_t by_exponent, int64_t *counts, int64_t *bytes,
              int64_t *gone, int64_t *gone_bytes)
{
    for (int64_t k = 0; k < n; k++) {
        int64_t key = group ? group_at(group, width, k) : 0;
        int64_t size = sizes ? sizes[k] : ((int64_t)lengths[k] << shift) + adjust;
        if (by_exponent)
            key = key * 64 + size_exponent(size);
        counts[key]++;
        bytes[key] = (int64_t)((uint64_t)bytes[key] + (uint64_t)size);   /* wraps as numpy's int64 sums do */
        if (leaked && leaked[k]) {
            gone[key]++;
            gone_bytes[key] = (int64_t)((uint64_t)gone_bytes[key] + (uint64_t)size);
        }
    }
}

/* The compressed rows of M edges from SOURCES (each below N): OFFSETS[s + 1] - OFFSETS[s] edges leave node s
 * (N + 1 of them, OFFSETS[0] = 0); returns whether SOURCES are in ascending order (else the caller sorts the
 * edges by source before the rows describe them). */
int64_t hw_rows(const int32_t *sources, int64_t m, int64_t n, int64_t *offsets)
{
    int64_t sorted = 1;
    for (int64_t s = 0; s <= n; s++)
        offsets[s] = 0;
    for (int64_t i = 0; i < m; i++) {
        offsets[sources[i] + 1]++;
        sorted &= i == 0 || sources[i] >= sources[i - 1];
    }
    for (int64_t s = 0; s < n; s++)
        offsets[s + 1] += offsets[s];
    return sorted;
}
