/* main_regions: a main arena in several pieces, as when sbrk cannot be used.
 *
 * Run with GLIBC_TUNABLES=glibc.malloc.hugetlb=2 (the harness sets it): from
 * glibc 2.35 that makes malloc's sbrk fail on purpose, so the main arena grows
 * by mmap'd pieces of about 1 MiB, each new piece ending the previous one with
 * fenceposts (before 2.35 the tunable does not exist and the arena is the
 * usual contiguous sbrk heap).  The main thread allocates about 4 MiB of
 * small buffers and frees every third one, so each piece holds free chunks.
 */
#include "hw.h"

#include <stdlib.h>

int main(int argc, char **argv)
{
    hw_init(argc, argv, "main_regions");
    enum { N = 6000 };
    static void *kept[N];
    for (int i = 0; i < N; i++)
        kept[i] = hw_malloc(600 + (i % 7) * 40);
    for (int i = 0; i < N; i += 3)
        hw_free(kept[i]);
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
