/* second_heap: a thread arena that outgrows its first 64 MiB heap.
 *
 * One worker allocates ~72 MiB in 96 KiB chunks (below the mmap threshold),
 * so its arena maps a second heap linked back to the first through
 * heap_info.prev; the first heap ends in fenceposts.  It then frees every
 * third chunk in both heaps.  The bulk memory is not written, so it stays out
 * of the core's data.
 */
#include "hw.h"

#include <stdlib.h>

#define CHUNKS 760
#define CHUNK_REQUEST (96 * 1024)

static void *worker(void *arg)
{
    (void)arg;
    static void *p[CHUNKS];
    for (int i = 0; i < CHUNKS; i++)
        p[i] = hw_malloc_cold(CHUNK_REQUEST);
    for (int i = 0; i < CHUNKS; i += 3)
        hw_free(p[i]);
    void *small[10];
    for (int i = 0; i < 10; i++)
        small[i] = hw_malloc(64);
    for (int i = 0; i < 10; i++)
        hw_free(small[i]);
    hw_ledger("worker");
    hw_arrive();
    hw_park();
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "second_heap");
    hw_spawn(worker, NULL);
    hw_wait_arrivals(1);
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
