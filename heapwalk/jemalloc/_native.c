/* jemalloc's slabs read in C, loaded with ctypes by heapwalk/jemalloc/native.py: the regions a slab hands
 * out, from its bitmap.  A plain loop over arrays numpy owns: no Python objects, no Python.h; heapwalk/jemalloc/
 * blocks.py holds the same in numpy, used when this library was not built, and the tests hold the two equal.
 */

#include <stdint.h>
#include <string.h>

/* The version of these functions' arguments (2: hw_slab_bitmap_regions counts when STARTS is NULL; 3:
 * hw_slab_regions_compact; 4: hw_compact_edit): a library built from older sources has another, or none, and is
 * not used. */
int64_t hw_jemalloc_abi(void)
{
    return 4;
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
 * from ADDRESS[r], each clear bit below NREGS[r] gives a region, slab by slab and each slab's in address order,
 * written as its start to STARTS and, where the array is given, its end to ENDS, its slab's ARENA[r] to ARENAS,
 * its size in 8-byte units to LENGTHS, its slab's TAG[r] to TAGS; a slab whose bitmap is not READABLE[r], or
 * does not count NFREE[r] set bits, gives none and is marked 0 in GOOD (1 otherwise).  Returns the number of
 * regions written; with STARTS NULL, only counted (for room of the right size). */
static int64_t slab_regions(const uint8_t *bitmaps, int64_t stride, int64_t n, const int64_t *nregs,
                            const uint64_t *size, const int32_t *nfree, const uint8_t *readable,
                            const uint64_t *address, const int32_t *arena, const uint8_t *tag, uint64_t *starts,
                            uint64_t *ends, int32_t *arenas, uint32_t *lengths, uint8_t *tags, uint8_t *good)
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
                if (ends)
                    ends[count] = starts[count] + size[r];
                if (arenas)
                    arenas[count] = arena[r];
                if (lengths)
                    lengths[count] = (uint32_t)(size[r] >> 3);
                if (tags)
                    tags[count] = tag[r];
                count++;
            }
        }
    }
    return count;
}

/* `slab_regions` with each region's start, end and arena (ARENA[r]). */
int64_t hw_slab_bitmap_regions(const uint8_t *bitmaps, int64_t stride, int64_t n, const int64_t *nregs,
                        const uint64_t *size, const int32_t *nfree, const uint8_t *readable, const uint64_t *address,
                        const int32_t *arena, uint64_t *starts, uint64_t *ends, int32_t *arenas, uint8_t *good)
{
    return slab_regions(bitmaps, stride, n, nregs, size, nfree, readable, address, arena, 0, starts, ends,
                        arenas, 0, 0, good);
}

/* `slab_regions` as the leak scan keeps blocks: each region's start, its size in 8-byte units (every SIZE[r] a
 * multiple of 8, its units below 2**32) and its slab's TAG[r] (its arena's index). */
int64_t hw_slab_regions_compact(const uint8_t *bitmaps, int64_t stride, int64_t n, const int64_t *nregs,
                                const uint64_t *size, const int32_t *nfree, const uint8_t *readable,
                                const uint64_t *address, const uint8_t *tag, uint64_t *starts, uint32_t *lengths,
                                uint8_t *tags, uint8_t *good)
{
    return slab_regions(bitmaps, stride, n, nregs, size, nfree, readable, address, 0, tag, starts, 0, 0, lengths,
                        tags, good);
}

/* The N blocks of the compact form (STARTS, LENGTHS, TAGS: `hw_slab_regions_compact`'s, strictly ascending by
 * start) less those that start at one of the NX values EXCLUDED (ascending), moved down in place; then the NO
 * blocks O_STARTS, O_LENGTHS, O_TAGS (ascending, none starting where one of the others does) merged in, in
 * address order, the others moved up in place from the last (the arrays have room for them).  Returns how many
 * blocks there are then. */
int64_t hw_compact_edit(uint64_t *starts, uint32_t *lengths, uint8_t *tags, int64_t n, const uint64_t *excluded,
                        int64_t nx, const uint64_t *o_starts, const uint32_t *o_lengths, const uint8_t *o_tags,
                        int64_t no)
{
    int64_t kept = 0, x = 0;
    for (int64_t r = 0; r < n; r++) {
        while (x < nx && excluded[x] < starts[r])
            x++;
        if (x < nx && excluded[x] == starts[r])
            continue;
        starts[kept] = starts[r];
        lengths[kept] = lengths[r];
        tags[kept] = tags[r];
        kept++;
    }
    int64_t out = kept + no, r = kept - 1, o = no - 1;
    while (o >= 0) {
        out--;
        if (r >= 0 && starts[r] > o_starts[o]) {
            starts[out] = starts[r];
            lengths[out] = lengths[r];
            tags[out] = tags[r];
            r--;
        } else {
            starts[out] = o_starts[o];
            lengths[out] = o_lengths[o];
            tags[out] = o_tags[o];
            o--;
        }
    }
    return kept + no;
}
