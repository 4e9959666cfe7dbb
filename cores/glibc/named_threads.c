/* named_threads: three worker threads that name themselves (pthread_setname_np) and allocate, then wait with
 * the main thread.  Run as it is or with jemalloc preloaded (MALLOC_CONF=background_thread:true adds jemalloc's
 * own threads); it prints "ready" once every thread has allocated.  tests/live/test_threadnames.py captures it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WORKERS 3

static pthread_barrier_t ready;

static void *worker(void *arg)
{
    char name[16];
    snprintf(name, sizeof name, "worker-%ld", (long)arg);
    pthread_setname_np(pthread_self(), name);
    for (int i = 0; i < 1000; i++) {
        char *p = malloc(100 + (size_t)i);
        memset(p, 1, 100);
        if (i % 3)
            free(p);
    }
    pthread_barrier_wait(&ready);
    for (;;)
        pause();
    return NULL;
}

int main(void)
{
    pthread_t threads[WORKERS];
    pthread_barrier_init(&ready, NULL, WORKERS + 1);
    for (long i = 0; i < WORKERS; i++)
        pthread_create(&threads[i], NULL, worker, (void *)i);
    for (int i = 0; i < 5000; i++) {
        void *p = malloc(1000);
        if (i % 2)
            free(p);
    }
    pthread_barrier_wait(&ready);
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}
