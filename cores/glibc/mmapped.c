/* mmapped: chunks above the mmap threshold, and a freed one that moved it.
 *
 * Four chunks are mmapped at the default 128 KiB threshold.  Freeing a 512 KiB
 * mmapped chunk raises the dynamic threshold (and the trim threshold) to its
 * size, so a later 400 KiB request comes from the heap instead.  A worker
 * thread, started first, holds an mmapped chunk too.  A bystander thread never
 * touches malloc, so it has no arena and no tcache.
 */
#include "hw.h"

#include <stdlib.h>

static void *worker(void *arg)
{
    (void)arg;
    void *p = hw_malloc(300 * 1024);
    hw_note_mmapped(p, 300 * 1024);
    void *q = hw_malloc(100);
    hw_free(q);
    hw_ledger("worker");
    hw_arrive();
    hw_park();
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "mmapped");
    /* the worker's chunk is mmapped at the default threshold, before it moves */
    hw_spawn(worker, NULL);
    hw_spawn_bystander();
    hw_wait_arrivals(2);
    static const size_t keep_sizes[] = { 200 * 1024, 1024 * 1024, 2 * 1024 * 1024 + 123, 160 * 1024 };
    for (int i = 0; i < 4; i++) {
        void *p = hw_malloc(keep_sizes[i]);
        hw_note_mmapped(p, keep_sizes[i]);
    }
    void *moved = hw_malloc(512 * 1024);
    hw_free(moved);
    void *from_heap = hw_malloc(400 * 1024);
    (void)from_heap;
    hw_note_fact("heap_allocated_request", 400 * 1024);
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
