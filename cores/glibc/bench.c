/* bench: a large, fragmented heap for `make bench`.
 *
 * HW_BENCH_CHUNKS (default 300000) allocations are spread over the main
 * thread and eight workers, each in its own arena; a worker's share of a
 * large run needs several 64 MiB heaps, so its arena gets a second and third
 * heap.  Sizes are mostly small (as in a C++ daemon full of small objects),
 * some medium and a few large: about 200 bytes per chunk on average, so six
 * million chunks make a heap of over 1 GiB.
 *
 * Each thread then frees every third chunk (the neighbours stay in use, so
 * nothing coalesces: tcache, fastbins and the unsorted bin fill up), asks for
 * one block larger than any free chunk (malloc sorts the unsorted bin into the
 * small and large bins on the way), and frees a last few chunks, which stay in
 * the unsorted bin.
 *
 * With HW_BENCH_SHAPE=random the heap is fragmented as real programs leave it: a
 * chunk in fifty (of under 1 KiB) grows twice with realloc as it is made (a
 * buffer being filled), and then half of the chunks, picked in random order,
 * are freed: free chunks coalesce with their neighbours, and every free list
 * runs back and forth across the arena's heaps.  Its chunks point to one another,
 * as a program's objects do: each to the one made before it and to one made
 * earlier at random, whether or not that one is freed later (the leak scan then
 * has millions of edges to follow and of dangling pointers to drop).
 *
 * Workers are plain pthreads (no hw_spawn key probe), so a worker's arena
 * holds exactly its live allocations, which the ledger records as facts
 * "live_TID" (the oracle for the benchmark's chunk count); the main arena also
 * holds what libc allocates for itself.
 */
#define _GNU_SOURCE
#include "hw.h"
#include "bench_shape.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WORKERS 8
#define LAST_FREES 40

static long share;
static int random_shape;     /* HW_BENCH_SHAPE=random */
static void *volatile sink;  /* stores through it keep gcc from eliding a malloc whose result looks unused */

/* Frees up to LAST_FREES live chunks spread over P (after the unsorted bin was sorted: they stay in it, or
 * in the tcache and fastbins); returns how many it freed. */
static long free_last_few(void **p)
{
    long freed = 0;
    for (long i = 1; i < share && freed < LAST_FREES; i += share / LAST_FREES + 1) {
        if (p[i]) {
            free(p[i]);
            p[i] = NULL;
            freed++;
        }
    }
    return freed;
}

/* The random shape: allocates this thread's share (a chunk in fifty grown twice by realloc), then frees
 * half of the chunks in random order; returns how many of its allocations stay live. */
static long build_random(unsigned seed)
{
    void **p = calloc((size_t)share, sizeof *p);
    long *order = malloc((size_t)share * sizeof *order);
    if (!p || !order) {
        fprintf(stderr, "bench: out of memory\n");
        abort();
    }
    long live = 0;
    for (long i = 0; i < share; i++) {
        size_t n = pick(&seed);
        p[i] = made(i, &n);
        if (!p[i]) {
            fprintf(stderr, "bench: out of memory\n");
            abort();
        }
        memset(p[i], 0x5A, n < 32 ? n : 32);
        link_objects(p, i, &seed);
        live++;
    }
    shuffled(order, share, &seed);
    for (long k = 0; k < share / 2; k++) {
        free(p[order[k]]);
        p[order[k]] = NULL;
        live--;
    }
    sink = malloc(120000);
    live++;
    live -= free_last_few(p);
    /* The two arrays stay: freeing a mmapped chunk would raise glibc's mmap threshold for every thread at a
     * moment that depends on the threads' timing, and with it where the other threads' arrays go. */
    if ((size_t)share * sizeof *p < 128 * 1024)
        live += 2;  /* under the mmap threshold they are arena chunks */
    return live;
}

/* Allocates this thread's share, frees every third chunk, sorts the unsorted bin, frees a few more;
 * returns how many of its allocations stay live. */
static long build(unsigned seed)
{
    void **p = calloc((size_t)share, sizeof *p);  /* mmapped when large; counted below when not */
    if (!p) {
        fprintf(stderr, "bench: out of memory\n");
        abort();
    }
    long live = 1;  /* the pointer array itself */
    for (long i = 0; i < share; i++) {
        size_t n = pick(&seed);
        p[i] = malloc(n);
        if (!p[i]) {
            fprintf(stderr, "bench: out of memory\n");
            abort();
        }
        memset(p[i], 0x5A, n < 32 ? n : 32);
        live++;
    }
    for (long i = 0; i < share; i += 3) {
        free(p[i]);
        p[i] = NULL;
        live--;
    }
    sink = malloc(120000);  /* larger than any free chunk: malloc sorts the unsorted bin */
    live++;
    live -= free_last_few(p);
    if ((size_t)share * sizeof *p >= 128 * 1024)
        live--;  /* calloc of the array was mmapped (above the mmap threshold): not an arena chunk */
    return live;
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 17u;
    long live = random_shape ? build_random(seed) : build(seed);
    char key[48];
    snprintf(key, sizeof key, "live_%d", (int)gettid());
    hw_note_fact(key, live);
    hw_arrive();
    hw_park();
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "bench");
    const char *n = getenv("HW_BENCH_CHUNKS");
    long total = n ? atol(n) : 300000;
    share = total / (WORKERS + 1);
    const char *shape = getenv("HW_BENCH_SHAPE");
    random_shape = shape != NULL && strcmp(shape, "random") == 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (long i = 0; i < WORKERS; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, (void *)(i + 1)) != 0) {
            fprintf(stderr, "bench: cannot start a worker\n");
            abort();
        }
        pthread_detach(t);
    }
    hw_wait_arrivals(WORKERS);
    if (random_shape)
        build_random(1);
    else
        build(1);
    hw_note_fact("workers", WORKERS);
    hw_note_fact("chunks_requested", share * (WORKERS + 1));
    hw_snapshot();
    return 0;
}
