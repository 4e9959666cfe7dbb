/* Whether a word points into a set of spans: shared by the leak scan's C (heapwalk/analysis/_reach.c) and the
 * allocators' own C passes that keep a heap's words as they read it. */

#ifndef HEAPWALK_SPANS_H
#define HEAPWALK_SPANS_H

#include <stdint.h>

/* Whether V lies in one of the NSPANS spans [BOUNDS[2s], BOUNDS[2s + 1]) (sorted, apart, NSPANS > 0).  *LAST_LO and
 * *LAST_HI hold the span the last value was found in, tried first (neighbouring words point near each other). */
static inline int in_spans(uint64_t v, const uint64_t *bounds, int64_t nspans, uint64_t *last_lo, uint64_t *last_hi)
{
    if (v - bounds[0] >= bounds[2 * nspans - 1] - bounds[0])
        return 0;
    if (v - *last_lo < *last_hi - *last_lo)
        return 1;
    int64_t a = 0, b = nspans;        /* the last span whose start is at or below v */
    while (b - a > 1) {
        int64_t m = (a + b) / 2;
        if (bounds[2 * m] <= v)
            a = m;
        else
            b = m;
    }
    if (v >= bounds[2 * a + 1])
        return 0;
    *last_lo = bounds[2 * a];
    *last_hi = bounds[2 * a + 1];
    return 1;
}

#endif
