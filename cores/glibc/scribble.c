/* scribble: a process that holds a heap and keeps writing to it while a capture copies it, for the test that
 * the capture's pre-copy gives the core a stop-the-world capture would (tests/vm/test_precopy.py).
 *
 * Usage: scribble DIR MIB THREADS RATE.  Each of THREADS threads (each in an arena of its own) allocates its
 * share of MIB mebibytes in blocks of random sizes (32 B to 128 KiB, and one in 64 a 1 MiB mmapped chunk),
 * each filled with its own pattern, and then DIR/ready is written.  With RATE 0 the threads then sleep (an
 * idle service); otherwise together they write about RATE MiB a second: each round rewrites random blocks
 * of its own, and one round in 8 frees one of them and allocates another of a random size (the heap churns,
 * mmapped chunks come and go).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct block {
    unsigned char *p;
    size_t size;
};

struct share {
    struct block *blocks;
    size_t count;
    size_t bytes;
    uint64_t seed;
    pthread_t thread;
};

static size_t per_thread;
static long rate_mib;
static int threads;
static pthread_barrier_t filled;

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t random_size(uint64_t *s)
{
    if (next(s) % 64 == 0)
        return 1 << 20;
    return 32 + next(s) % (next(s) % 4 == 0 ? (128 << 10) : 2048);
}

static void fill(struct block *b, uint64_t *s)
{
    memset(b->p, (int)(next(s) % 255) + 1, b->size);
}

static void *work(void *arg)
{
    struct share *sh = arg;
    size_t room = per_thread / 32 + 16;
    sh->blocks = calloc(room, sizeof *sh->blocks);
    while (sh->bytes < per_thread && sh->count < room) {
        struct block *b = &sh->blocks[sh->count++];
        b->size = random_size(&sh->seed);
        b->p = malloc(b->size);
        fill(b, &sh->seed);
        sh->bytes += b->size;
    }
    pthread_barrier_wait(&filled);
    if (rate_mib == 0)
        for (;;)
            pause();
    /* each round writes about 1 MiB / THREADS, then sleeps so that all write RATE MiB a second */
    long budget = (1 << 20) / threads;
    long long nap_ns = 1000000000LL / rate_mib;
    struct timespec nap = {(time_t)(nap_ns / 1000000000LL), (long)(nap_ns % 1000000000LL)};
    for (uint64_t round = 0;; round++) {
        long written = 0;
        while (written < budget) {
            struct block *b = &sh->blocks[next(&sh->seed) % sh->count];
            size_t at = next(&sh->seed) % b->size, n = b->size - at < 4096 ? b->size - at : 4096;
            memset(b->p + at, (int)(round % 251) + 1, n);
            written += (long)n;
        }
        if (round % 8 == 0) {
            struct block *b = &sh->blocks[next(&sh->seed) % sh->count];
            free(b->p);
            b->size = random_size(&sh->seed);
            b->p = malloc(b->size);
            fill(b, &sh->seed);
        }
        nanosleep(&nap, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: scribble DIR MIB THREADS RATE\n");
        return 2;
    }
    const char *dir = argv[1];
    threads = atoi(argv[3]);
    rate_mib = atol(argv[4]);
    per_thread = (size_t)atol(argv[2]) * (1 << 20) / (size_t)threads;
    pthread_barrier_init(&filled, NULL, (unsigned)threads + 1);
    struct share *shares = calloc((size_t)threads, sizeof *shares);
    for (int i = 0; i < threads; i++) {
        shares[i].seed = 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1);
        pthread_create(&shares[i].thread, NULL, work, &shares[i]);
    }
    pthread_barrier_wait(&filled);
    char path[4096];
    snprintf(path, sizeof path, "%s/ready", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    for (;;)
        pause();
}
