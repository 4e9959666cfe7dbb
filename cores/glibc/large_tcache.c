/* large_tcache: glibc 2.42+'s large tcache bins, and 2.43 caching an mmapped chunk.
 *
 * Run with GLIBC_TUNABLES=glibc.malloc.tcache_max=2097152 (the harness sets it),
 * which lets chunks up to 2 MiB into tcache (a request of 4 MiB, the documented
 * maximum, maps past the last large bin and is ignored by glibc 2.43).  The main thread frees chunks of
 * several sizes above the small bins' 1032 bytes, two of them in one size class,
 * and one mmapped chunk.  Each freed chunk whose second word carries the tcache
 * key sits in the tcache (glibc clears the key when a chunk leaves it); the
 * ledger lists those as "large_tcache".  Before 2.42 none qualifies, and before
 * 2.43 the mmapped one is unmapped on free.  The mmapped chunk is the only one
 * the process has, so mp_.mmapped_mem is the size of its mapping.
 */
#include "hw.h"

#include <stdlib.h>

int main(int argc, char **argv)
{
    hw_init(argc, argv, "large_tcache");
    static const size_t requests[] = { 1500, 1800, 3000, 20000, 100000, 300000 };
    enum { N = sizeof requests / sizeof requests[0] };
    void *chunks[N];
    for (int i = 0; i < N; i++) {
        chunks[i] = hw_malloc(requests[i]);
        hw_malloc(24); /* a guard: no two freed chunks are neighbours */
    }
    hw_note_fact("mmapped_request", 300000);
    for (int i = 0; i < N; i++)
        hw_free(chunks[i]);
    for (int i = 0; i < N; i++)
        hw_note_large_tcache(chunks[i]);
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
