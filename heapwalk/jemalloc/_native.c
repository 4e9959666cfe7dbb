/* jemalloc's slabs read in C, loaded with ctypes by heapwalk/jemalloc/native.py: the regions a slab hands
 * out, from its bitmap.  A plain loop over arrays numpy owns: no Python objects, no Python.h; heapwalk/jemalloc/
 * blocks.py holds the same in numpy, used when this library was not built, and the tests hold the two equal.
 */

#include <stdint.h>
#include <string.h>

/* The regions N slabs hand out, from their bitmaps (BITMAPS: 64 bytes a slab, bit k set when region k is free):
 * for slab r, of NREGS[r] regions (at most the bitmap's 512) of SIZE[r] bytes from ADDRESS[r], in arena
 * ARENA[r], each clear bit below NREGS[r] gives a region [start, start + size) to STARTS, ENDS and ARENAS, slab
 * by slab and each slab's in address order; a slab whose bitmap is not READABLE[r], or does not count NFREE[r]
 * set bits, gives none and is marked 0 in GOOD (1 otherwise).  Returns the number of regions written. */
int64_t hw_slab_regions(const uint8_t *bitmaps, int64_t n, const int64_t *nregs, const uint64_t *size,
                        const int32_t *nfree, const uint8_t *readable, const uint64_t *address, const int32_t *arena,
                        uint64_t *starts, uint64_t *ends, int32_t *arenas, uint8_t *good)
{
    int64_t count = 0;
    for (int64_t r = 0; r < n; r++) {
        uint64_t words[8];
        memcpy(words, bitmaps + 64 * r, 64);
        int64_t bits = nregs[r] < 512 ? nregs[r] : 512, set = 0;
        for (int64_t w = 0; w < 8 && 64 * w < bits; w++) {
            uint64_t mask = bits - 64 * w >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << (bits - 64 * w)) - 1);
            words[w] &= mask;
            set += __builtin_popcountll(words[w]);
        }
        good[r] = readable[r] && set == nfree[r];
        if (!good[r])
            continue;
        for (int64_t k = 0; k < bits; k++) {
            if (words[k >> 6] >> (k & 63) & 1)
                continue;
            starts[count] = address[r] + (uint64_t)k * size[r];
            ends[count] = starts[count] + size[r];
            arenas[count] = arena[r];
            count++;
        }
    }
    return count;
}
