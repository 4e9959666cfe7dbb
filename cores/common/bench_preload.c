/* bench_preload: bench.c's random shape on whatever malloc LD_PRELOAD puts under the program, for `make bench` on
 * tcmalloc and mimalloc (tests/tools/bench_preload.py).
 *
 * HW_BENCH_CHUNKS (default 300000) allocations are spread over eight workers, each with bench.c's sizes, links
 * and realloc churn (bench_shape.h); then half of each worker's blocks, picked in random order, are freed and
 * the workers park.  The main thread writes the address of every block the program still holds (each worker's
 * live blocks and its two arrays) to live.bin (little-endian 64-bit words) and their count to facts.json in the
 * folder given as its one argument, from static buffers with write(2), then stops itself (SIGSTOP) for the
 * core.  The bench checks that heapwalk finds each of them in use (tests/tools/bench_dump.py). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_shape.h"

#define WORKERS 8
#define BATCH 8192

static long share;
static pthread_barrier_t parked;
static void **kept[WORKERS];
static long *orders[WORKERS];
static unsigned long batch[BATCH];

static void die(const char *what)
{
    write(2, what, strlen(what));
    write(2, "\n", 1);
    _exit(1);
}

/* Worker ID's share: made, linked, grown, then half freed in random order (bench_shape.h). */
static void build_random(long id, unsigned seed)
{
    kept[id] = random_share(share, seed, &orders[id]);
    if (!kept[id])
        die("bench_preload: out of memory");
}

static void *worker(void *arg)
{
    long id = (long)arg;
    build_random(id, (unsigned)(id + 1) * 7919u + 17u);
    pthread_barrier_wait(&parked);
    for (;;)
        pause();
    return NULL;
}

static int open_out(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die("bench_preload: cannot write its output");
    return fd;
}

/* Adds ADDRESS to live.bin (FD), BATCH words at a time. */
static long used;
static void keep(int fd, const void *address)
{
    batch[used++] = (unsigned long)address;
    if (used == BATCH) {
        if (write(fd, batch, sizeof batch) != (ssize_t)sizeof batch)
            die("bench_preload: cannot write live.bin");
        used = 0;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: bench_preload OUTDIR");
    const char *n = getenv("HW_BENCH_CHUNKS");
    share = (n ? atol(n) : 300000) / WORKERS;
    int live_fd = open_out(argv[1], "live.bin"), facts_fd = open_out(argv[1], "facts.json");
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
    for (int w = 0; w < WORKERS; w++) {
        keep(live_fd, kept[w]);
        keep(live_fd, orders[w]);
        live += 2;
        for (long i = 0; i < share; i++)
            if (kept[w][i]) {
                keep(live_fd, kept[w][i]);
                live++;
            }
    }
    if (used && write(live_fd, batch, (size_t)used * sizeof *batch) != (ssize_t)(used * sizeof *batch))
        die("bench_preload: cannot write live.bin");
    close(live_fd);
    char facts[64];
    int k = snprintf(facts, sizeof facts, "{\"live\": %ld}\n", live);
    write(facts_fd, facts, (size_t)k);
    close(facts_fd);
    raise(SIGSTOP);
    return 0;
}
