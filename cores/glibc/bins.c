/* bins: the main arena only, with every kind of free list populated.
 *
 * tcache: a full bin (0x20, 0x70, 0x190, 0x3f0) and a partial one (0x30);
 * fastbins 0x20 and 0x70 (overflow of the full tcache bins); small bins 0x190
 * and 0x3f0; large bins with different sizes in one bin (0x440/0x450/0x450/0x470
 * in bin 65, 0x3000/0x3400 in bin 113) so the nextsize list matters; a
 * last_remainder split from a small bin chunk; two chunks left in the unsorted
 * bin.  Guards (small in-use chunks) keep free chunks from coalescing.
 */
#include "hw.h"

#include <stdlib.h>

static void *guard(void) { return hw_malloc(24); }

/* Allocates n chunks of `request` bytes, each followed by a guard. */
static void alloc_guarded(void **out, int n, size_t request)
{
    for (int i = 0; i < n; i++) {
        out[i] = hw_malloc(request);
        guard();
    }
}

static void free_all(void **p, int n)
{
    for (int i = 0; i < n; i++)
        hw_free(p[i]);
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "bins");
    int fill = hw_tcache_fill();

    void *small_190[32], *small_3f0[32], *large[8], *fast_20[48], *fast_70[48], *partial_30[3], *late[2];
    static const size_t large_requests[8] = { 0x430, 0x448, 0x468, 0x448, 0xff8, 0x11f8, 0x2ff8, 0x33f8 };

    alloc_guarded(small_190, fill + 2, 0x180);
    alloc_guarded(small_3f0, fill + 1, 0x3e8);
    for (int i = 0; i < 8; i++)
        alloc_guarded(&large[i], 1, large_requests[i]);
    alloc_guarded(fast_20, fill + 5, 24);
    alloc_guarded(fast_70, fill + 3, 100);
    alloc_guarded(partial_30, 3, 40);
    alloc_guarded(&late[0], 1, 0x7f8);
    alloc_guarded(&late[1], 1, 0x5f8);

    /* tcache full for 0x190 and 0x3f0, the rest into the unsorted bin */
    free_all(small_190, fill + 2);
    free_all(small_3f0, fill + 1);
    free_all(large, 8);
    /* a large request sorts the unsorted bin into small and large bins */
    void *big = hw_malloc(0x5000);
    (void)big;
    /* a small request with no exact fit splits a 0x190 small-bin chunk:
     * the remainder goes to the unsorted bin and becomes last_remainder */
    void *split = hw_malloc(0x100);
    (void)split;
    /* fastbins: frees past the full tcache bins (after the large request,
     * which would have consolidated them) */
    free_all(fast_20, fill + 5);
    free_all(fast_70, fill + 3);
    free_all(partial_30, 3);
    /* two more chunks in the unsorted bin */
    free_all(late, 2);

    hw_ledger("main");
    hw_snapshot();
    return 0;
}
