/* je_bench: bench.c's random shape on jemalloc, for `make bench` (run with LD_PRELOAD=libjemalloc.so.2).
 *
 * HW_BENCH_CHUNKS (default 300000) allocations are spread over eight workers, each in an arena of its own
 * (arenas.create), with bench.c's sizes: mostly small objects, some of a few hundred bytes, a few of some
 * KiB and some tens of KiB.  A block in fifty (of under 1 KiB) grows twice with realloc as it is made, as a
 * buffer being filled; each block points to the one made before it and to one made earlier at random (the
 * leak scan's edges and dangling pointers); then half of the blocks, picked in random order, are freed, so
 * that every slab is left partly used and the arenas hold dirty pages.
 *
 * Each worker's live blocks (its two arrays among them) are written to the ledger as "live" facts beside
 * its thread; then the main thread takes jemalloc's snapshot (je_common.h: stats.json from
 * malloc_stats_print, ledger.json) and the process stops.
 */
#include "je_common.h"
#include "bench_shape.h"

#define WORKERS 8

static long share;
static pthread_barrier_t parked;
static long live_of[WORKERS];

/* This worker's share: made, linked, grown, then half freed in random order; returns the live blocks. */
static long build_random(unsigned seed) {
    long *order;
    if (!random_share(share, seed, &order))
        die("je_bench: out of memory");
    return share - share / 2 + 2;    /* the blocks kept, and the two arrays */
}

static void *worker(void *arg) {
    long id = (long)arg;
    je_own_arena();
    live_of[id] = build_random((unsigned)(id + 1) * 7919u + 17u);
    return je_park("worker", &parked);
}

int main(int argc, char **argv) {
    if (argc < 2)
        die("usage: je_bench OUTDIR");
    je_find();
    const char *n = getenv("HW_BENCH_CHUNKS");
    share = (n ? atol(n) : 300000) / WORKERS;
    int stats_fd = open_out(argv[1], "stats.json"), ledger_fd = open_out(argv[1], "ledger.json");
    pthread_barrier_init(&parked, NULL, WORKERS + 1);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (long i = 0; i < WORKERS; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, (void *)i) != 0)
            die("pthread_create failed");
    }
    pthread_barrier_wait(&parked);
    long live = 0;
    for (int i = 0; i < WORKERS; i++)
        live += live_of[i];
    char facts[64];
    int k = snprintf(facts, sizeof facts, "{\"live\": %ld}\n", live);
    int facts_fd = open_out(argv[1], "facts.json");
    write(facts_fd, facts, (size_t)k);
    close(facts_fd);
    je_snapshot(stats_fd, ledger_fd);
    return 0;
}
