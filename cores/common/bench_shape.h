/* What the benchmark's programs (bench.c on glibc's malloc, je_bench.c on jemalloc, bench_preload.c on the others)
 * share: the sizes they
 * allocate, how their objects point to one another, and the random order they free them in, so that both
 * allocators are timed on the same program. */
#ifndef BENCH_SHAPE_H
#define BENCH_SHAPE_H

#include <stdlib.h>
#include <string.h>

/* A size from SEED: mostly small objects (as in a C++ daemon), some medium and a few large: about 200 bytes per
 * allocation on average. */
static size_t pick(unsigned *seed)
{
    unsigned r = (unsigned)rand_r(seed) % 1000;
    if (r < 800)
        return 16 + (size_t)(rand_r(seed) % 96);        /* 32-128 byte chunks */
    if (r < 990)
        return 128 + (size_t)(rand_r(seed) % 512);      /* small bins */
    if (r < 999)
        return 1024 + (size_t)(rand_r(seed) % 3072);    /* large bins, 64 and 512 bytes apart */
    return 16384 + (size_t)(rand_r(seed) % 32768);      /* large bins, 4 KiB apart */
}

/* A random index below N from SEED (rand_r gives 31 bits; two of them cover any share). */
static long below(long n, unsigned *seed)
{
    unsigned long r = ((unsigned long)rand_r(seed) << 31) ^ (unsigned long)rand_r(seed);
    return (long)(r % (unsigned long)n);
}

/* Makes object I of P an object of a pointer-rich program: its first word points to the object made before it,
 * its second to one made earlier at random (either may be freed later: a dangling pointer the leak scan must
 * look up and drop). */
static void link_objects(void **p, long i, unsigned *seed)
{
    void **words = p[i];
    if (i > 0)
        words[0] = p[i - 1];
    if (i > 1)
        words[1] = p[below(i, seed)];
}

/* Object I of *N bytes: one in fifty (of under 1 KiB) grown twice with realloc as it is made, as a buffer being
 * filled (*N is then three times as much: what is written to it); NULL when memory runs out. */
static void *made(long i, size_t *n)
{
    void *p = malloc(*n);
    if (p && i % 50 == 49 && *n < 1024) {
        p = realloc(p, *n * 3);
        *n *= 3;
        if (p)
            p = realloc(p, *n * 2);
    }
    return p;
}

/* ORDER[0 .. N) set to 0 .. N-1 in a random order from SEED. */
static void shuffled(long *order, long n, unsigned *seed)
{
    for (long i = 0; i < n; i++)
        order[i] = i;
    for (long i = n - 1; i > 0; i--) {
        long j = below(i + 1, seed), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* A worker's SHARE objects in the random shape: made, linked and grown (`made`, `link_objects`), then half of
 * them, picked in random order from SEED, freed (their slots set NULL).  Returns the array of them (NULL when
 * memory runs out) and sets *ORDER to the order array; both stay allocated, as live blocks of the program. */
static inline void **random_share(long share, unsigned seed, long **order)
{
    void **p = malloc((size_t)share * sizeof *p);
    *order = malloc((size_t)share * sizeof **order);
    if (!p || !*order)
        return NULL;
    for (long i = 0; i < share; i++) {
        size_t n = pick(&seed);
        p[i] = made(i, &n);
        if (!p[i])
            return NULL;
        memset(p[i], 0x5A, n < 32 ? n : 32);
        link_objects(p, i, &seed);
    }
    shuffled(*order, share, &seed);
    for (long k = 0; k < share / 2; k++) {
        free(p[(*order)[k]]);
        p[(*order)[k]] = NULL;
    }
    return p;
}

#endif
