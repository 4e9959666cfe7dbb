/* jemalloc's slabs read in C, loaded with ctypes by heapwalk/jemalloc/native.py: the regions a slab hands
 * out, from its bitmap.  A plain loop over arrays numpy owns: no Python objects, no Python.h; heapwalk/jemalloc/
 * blocks.py holds the same in numpy, used when this library was not built, and the tests hold the two equal.
 */

#include <stdint.h>
#include <string.h>

/* The version of these functions' arguments (2: hw_slab_bitmap_regions counts when STARTS is NULL; 3:
 * hw_slab_regions_compact): a library built from older sources has another, or none, and is not used. */
int64_t hw_jemalloc_abi(void)
{
    return 3;
}

/* Word W of a bitmap, its bits from BITS on cleared. */
static uint64_t bitmap_word(const uint8_t *map, int64_t w, int64_t bits)
{
    uint64_t word;
    memcpy(&word, map + 8 * w, 8);
    return bits - 64 * w >= 64 ? word : word & (((uint64_t)1 << (bits - 64 * w)) - 1);
}

/* The regions N slabs hand out, from their bitmaps (BITMAPS: STRIDE bytes a slab, a multiple of 8, bit k set
 * when region k is free): for slab r, of NREGS[r] regions (at most the bitmap's 8 * STRIDE) of SIZE[r] bytes
 * from ADDRESS[r], in arena ARENA[r], each clear bit below NREGS[r] gives a region [start, start + size) to
 * STARTS, ENDS and ARENAS, slab by slab and each slab's in address order; a slab whose bitmap is not
 * READABLE[r], or does not count NFREE[r] set bits, gives none and is marked 0 in GOOD (1 otherwise).  Returns
 * the number of regions written; with STARTS NULL, only counted (for room of the right size). */
int64_t hw_slab_bitmap_regions(const uint8_t *bitmaps, int64_t stride, int64_t n, const int64_t *nregs,
                        const uint64_t *size, const int32_t *nfree, const uint8_t *readable, const uint64_t *address,
                        const int32_t *arena, uint64_t *starts, uint64_t *ends, int32_t *arenas, uint8_t *good)
{
    int64_t count = 0;
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *map = bitmaps + stride * r;
        int64_t bits = nregs[r] < 8 * stride ? nregs[r] : 8 * stride, set = 0;
        for (int64_t w = 0; 64 * w < bits; w++)
            set += __builtin_popcountll(bitmap_word(map, w, bits));
        good[r] = readable[r] && set == nfree[r];
        if (!good[r])
            continue;
        if (!starts) {
            count += bits - set;
            continue;
        }
        for (int64_t w = 0; 64 * w < bits; w++) {
            uint64_t word = bitmap_word(map, w, bits);
            for (int64_t k = 64 * w; k < bits && k < 64 * w + 64; k++) {
                if (word >> (k & 63) & 1)
                    continue;
                starts[count] = address[r] + (uint64_t)k * size[r];
                ends[count] = starts[count] + size[r];
                arenas[count] = arena[r];
                count++;
            }
        }
    }
    return count;
}

/* hw_slab_bitmap_regions's regions as the leak scan keeps them: each region's start to STARTS, its size in 8-byte
 * units to LENGTHS (every SIZE[r] a multiple of 8, its units below 2**32) and its slab's TAG[r] (its arena's
 * index) to TAGS; GOOD as there.  Returns the number written (counted alone when STARTS is NULL). */
int64_t hw_slab_regions_compact(const uint8_t *bitmaps, int64_t stride, int64_t n, const int64_t *nregs,
                                const uint64_t *size, const int32_t *nfree, const uint8_t *readable,
                                const uint64_t *address, const uint8_t *tag, uint64_t *starts, uint32_t *lengths,
                                uint8_t *tags, uint8_t *good)
{
    int64_t count = 0;
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *map = bitmaps + stride * r;
        int64_t bits = nregs[r] < 8 * stride ? nregs[r] : 8 * stride, set = 0;
        for (int64_t w = 0; 64 * w < bits; w++)
            set += __builtin_popcountll(bitmap_word(map, w, bits));
        good[r] = readable[r] && set == nfree[r];
        if (!good[r])
            continue;
        if (!starts) {
            count += bits - set;
            continue;
        }
        for (int64_t w = 0; 64 * w < bits; w++) {
            uint64_t word = bitmap_word(map, w, bits);
            for (int64_t k = 64 * w; k < bits && k < 64 * w + 64; k++) {
                if (word >> (k & 63) & 1)
                    continue;
                starts[count] = address[r] + (uint64_t)k * size[r];
                lengths[count] = (uint32_t)(size[r] >> 3);
                tags[count] = tag[r];
                count++;
            }
        }
    }
    return count;
}
