/* thread_arenas: the OpenMP image-resize pattern.
 *
 * Eight worker threads each get a thread arena.  In each round a worker
 * allocates a batch of ~30 KB row buffers and small per-row records, frees
 * most of them and keeps a few survivors, which pin the heap and leave free
 * chunks between them.  Workers then park; their arenas hold free chunks in the
 * unsorted, small and large bins, and their tcaches hold small records.
 */
#include "hw.h"

#include <stdint.h>
#include <stdlib.h>

#define WORKERS 8
#define ROUNDS 24
#define ROWS 40

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 17u;
    static __thread void *keep[ROUNDS * 4 + 8];
    int nkeep = 0;
    for (int round = 0; round < ROUNDS; round++) {
        void *rows[ROWS], *recs[ROWS];
        for (int i = 0; i < ROWS; i++) {
            rows[i] = hw_malloc(30000 + (size_t)(rand_r(&seed) % 4096));
            recs[i] = hw_malloc(24 + (size_t)(rand_r(&seed) % 6) * 16);
        }
        for (int i = 0; i < ROWS; i++) {
            if (i % 11 == round % 11)
                keep[nkeep++] = rows[i];
            else
                hw_free(rows[i]);
            hw_free(recs[i]);
        }
    }
    /* a last batch freed in place leaves chunks in the unsorted bin */
    void *tail[6];
    for (int i = 0; i < 6; i++) {
        tail[i] = hw_malloc(2000 + (size_t)i * 300);
        keep[nkeep++] = hw_malloc(24);
    }
    for (int i = 0; i < 6; i++)
        hw_free(tail[i]);
    hw_ledger("worker");
    hw_arrive();
    hw_park();
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "thread_arenas");
    for (long i = 0; i < WORKERS; i++)
        hw_spawn(worker, (void *)i);
    hw_wait_arrivals(WORKERS);
    hw_note_fact("workers", WORKERS);
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
