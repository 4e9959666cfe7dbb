/* many_arenas: more threads than the arena limit allows.
 *
 * The limit is 8 x cores on 64-bit (or MALLOC_ARENA_MAX).  First a few threads
 * run and exit, so their arenas go to the free list; then limit + 4 threads
 * start: they take the free-list arenas, create new ones up to the limit, and
 * the rest share arenas (attached_threads > 1).  Finally a few of them exit,
 * leaving arenas on the free list again or sharers gone.
 */
#define _GNU_SOURCE
#include "hw.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#define EARLY 4
#define LEAVERS 3

/* Threads share arenas here, and a malloc that misses its tcache stashes other
 * chunks of its size class from the arena's bins into the tcache.  So each
 * staying thread frees tcache-sized chunks of one size class of its own (no
 * other thread's chunk can land in its tcache), and threads that exit free
 * only chunks too big for tcache (an exiting thread's tcache entries would be
 * freed into the bins still carrying the tcache key). */
static void churn(unsigned seed, int own_class)
{
    void *small[12], *large[16];
    for (int i = 0; i < 16; i++) {
        large[i] = hw_malloc(1100 + (size_t)(rand_r(&seed) % 2000));
        if (own_class >= 0 && i < 12)
            small[i] = hw_malloc((size_t)own_class * 16 + 24);
    }
    for (int i = 0; i < 16; i += 2)
        hw_free(large[i]);
    if (own_class >= 0)
        for (int i = 0; i < 10; i++)
            hw_free(small[i]);
}

static void *early(void *arg)
{
    churn((unsigned)(uintptr_t)arg, -1);
    hw_arrive();
    return NULL;
}

static void *stayer(void *arg)
{
    churn((unsigned)(uintptr_t)arg + 100, 2 + (int)((uintptr_t)arg % 60));
    hw_ledger("worker");
    hw_arrive();
    hw_park();
}

static void *leaver(void *arg)
{
    churn((unsigned)(uintptr_t)arg + 200, -1);
    hw_arrive();
    return NULL;
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "many_arenas");
    const char *env = getenv("MALLOC_ARENA_MAX");
    int limit = env ? atoi(env) : 8 * get_nprocs();
    int stayers = limit + 4 - LEAVERS;
    hw_note_fact("arena_limit", limit);
    hw_note_fact("threads", limit + 4 + EARLY);
    for (long i = 0; i < EARLY; i++)
        hw_spawn(early, (void *)i);
    hw_wait_arrivals(EARLY);
    usleep(200000); /* let them finish exiting: their arenas go to the free list */
    for (long i = 0; i < stayers; i++) {
        hw_spawn(stayer, (void *)i);
        if (i == stayers / 2)
            for (long j = 0; j < LEAVERS; j++)
                hw_spawn(leaver, (void *)j);
    }
    hw_wait_arrivals(stayers + LEAVERS);
    usleep(200000);
    hw_note_fact("stayers", stayers);
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
