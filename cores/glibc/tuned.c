/* tuned: a service whose malloc parameters no longer hold glibc's defaults.
 *
 * Long-running programs move mp_ away from its initial values: freeing an
 * mmapped chunk raises the dynamic mmap threshold (and the trim threshold to
 * twice that), realloc of an mmapped chunk goes through mremap, and operators
 * set mallopt() parameters or GLIBC_TUNABLES.  This reproducer does the first
 * two always and applies the mallopt() calls listed in HW_MALLOPT
 * ("name=value,..." with names mmap_threshold, trim_threshold, top_pad,
 * mmap_max, arena_max, arena_test); the harness sets GLIBC_TUNABLES per variant.
 *
 * Three workers, started one after the other, share the arenas the limit
 * allows; the main arena holds free chunks of every kind.  Every chunk that came out mmapped is in the ledger,
 * whatever the thresholds made of the requests.  The ledger's facts say what
 * the program did: the largest mmapped chunk it freed (the dynamic threshold's
 * value when no parameter was set) and how many mremap calls it made.
 */
#include "hw.h"

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORKERS 3

static int is_mmapped(void *p) { return (int)((((size_t *)p)[-1] >> 1) & 1); }

/* Keeps an allocation of N bytes; noted in the ledger when glibc mmapped it. */
static void *keep_big(size_t n, int cold)
{
    void *p = cold ? hw_malloc_cold(n) : hw_malloc(n);
    if (is_mmapped(p))
        hw_note_mmapped(p, n);
    return p;
}

/* The largest size field of a mmapped chunk the program freed: with no parameter set, glibc's dynamic
 * threshold follows the freed chunk sizes up (to 32 MiB), so mp_.mmap_threshold ends at this. */
static size_t freed_mmapped_max;

static void note_free_of_mmapped(void *p)
{
    size_t size = ((size_t *)p)[-1] & ~(size_t)7;
    if (is_mmapped(p) && size > freed_mmapped_max)
        freed_mmapped_max = size;
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 104729u + 3u;
    static __thread void *keep[64];
    int nkeep = 0;
    for (int round = 0; round < 6; round++) {
        void *rows[24];
        for (int i = 0; i < 24; i++)
            rows[i] = hw_malloc(200 + (size_t)(rand_r(&seed) % 3000));
        for (int i = 0; i < 24; i++) {
            if (i % 5 == round % 5)
                keep[nkeep++] = rows[i];
            else
                hw_free(rows[i]);
        }
    }
    for (int i = 0; i < 12; i++) {
        void *small = hw_malloc(24 + (size_t)(i % 4) * 16);
        if (i % 3)
            hw_free(small);
    }
    keep_big(300 * 1024 + (size_t)(uintptr_t)arg * 4096, 0);
    hw_ledger("worker");
    hw_arrive();
    hw_park();
}

static int mallopt_param(const char *name)
{
    static const struct { const char *name; int param; } known[] = {
        { "mmap_threshold", M_MMAP_THRESHOLD }, { "trim_threshold", M_TRIM_THRESHOLD },
        { "top_pad", M_TOP_PAD }, { "mmap_max", M_MMAP_MAX },
        { "arena_max", M_ARENA_MAX }, { "arena_test", M_ARENA_TEST },
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(known[i].name, name) == 0)
            return known[i].param;
    fprintf(stderr, "tuned: unknown mallopt parameter %s\n", name);
    exit(2);
}

/* Applies HW_MALLOPT ("name=value,...") before any allocation of the program's own. */
static void apply_mallopt(void)
{
    const char *spec = getenv("HW_MALLOPT");
    char buf[256];
    if (!spec || !*spec)
        return;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq) {
            fprintf(stderr, "tuned: HW_MALLOPT item without '=': %s\n", item);
            exit(2);
        }
        *eq = '\0';
        if (mallopt(mallopt_param(item), atoi(eq + 1)) != 1) {
            fprintf(stderr, "tuned: mallopt(%s, %s) refused\n", item, eq + 1);
            exit(2);
        }
    }
}

int main(int argc, char **argv)
{
    apply_mallopt();
    hw_init(argc, argv, "tuned");
    /* one worker at a time: with an arena limit they share arenas, and a worker's proof of its tcache
     * must not race another's frees into the same arena */
    for (long i = 0; i < WORKERS; i++) {
        hw_spawn(worker, (void *)i);
        hw_wait_arrivals(1);
    }

    /* A freed mmapped chunk moves the dynamic threshold to its size (about 3 MiB, as a Python
     * service's large buffers do), unless a parameter was set. */
    void *big = hw_malloc_cold(3 * 1024 * 1024 + 4000);
    note_free_of_mmapped(big);
    hw_free(big);

    /* realloc of a mmapped chunk goes through mremap (glibc 2.43 then counts 16 bytes too many in
     * mmapped_mem, which stay after the chunk is freed) */
    int mremaps = 0;
    void *grown = hw_malloc_cold(5 * 1024 * 1024);
    for (int i = 1; i <= 2; i++) {
        int was = is_mmapped(grown);
        grown = realloc(grown, (size_t)(5 + 2 * i) * 1024 * 1024 + 123);
        if (!grown)
            return 1;
        mremaps += was && is_mmapped(grown);
    }
    if (is_mmapped(grown))
        hw_note_mmapped(grown, 9 * 1024 * 1024 + 123);
    void *gone = hw_malloc_cold(6 * 1024 * 1024);
    int was = is_mmapped(gone);
    gone = realloc(gone, 7 * 1024 * 1024);
    if (!gone)
        return 1;
    mremaps += was && is_mmapped(gone);
    note_free_of_mmapped(gone);
    free(gone);
    hw_note_fact("mremaps", mremaps);
    hw_note_fact("freed_mmapped_max", (long long)freed_mmapped_max);

    /* chunks of every kind in the main arena */
    void *hold[40];
    for (int i = 0; i < 40; i++)
        hold[i] = hw_malloc(24 + (size_t)(i % 8) * 16 + (i % 5 == 0 ? 1500 : 0));
    for (int i = 0; i < 40; i += 2)
        hw_free(hold[i]);
    void *mid = hw_malloc(1024 * 1024);   /* from the heap once the threshold has moved */
    keep_big(200 * 1024, 0);
    keep_big(40 * 1024 * 1024, 1);         /* above every threshold a program can set */
    hw_free(hw_malloc(100000));
    (void)mid;
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
