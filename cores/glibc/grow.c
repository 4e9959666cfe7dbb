/* grow: a running service whose memory grows in one thread arena, for `heapwalk capture` and `heapwalk diff`.
 *
 * Usage: grow DIR.  Two workers each take an arena and allocate a little; then the
 * process keeps running (it is never stopped, unlike the other reproducers).  Each
 * SIGUSR1 makes the "grower" worker allocate another 2000 chunks of 1-4 KiB and
 * free every other one (the heap grows, with holes); the "steady" worker does
 * nothing more.  After each step, and once at the start, it writes DIR/state:
 * "STEP GROWER_TID STEADY_TID".  SIGTERM ends it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *dir;
static sem_t grow_request, step_done;
static volatile pid_t grower_tid, steady_tid;
static void *volatile sink;

static void write_state(int step)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/state", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror("grow: state");
        exit(1);
    }
    fprintf(f, "%d %d %d\n", step, (int)grower_tid, (int)steady_tid);
    fclose(f);
    rename(tmp, path);
}

static void *grower(void *arg)
{
    (void)arg;
    grower_tid = gettid();
    unsigned seed = 7;
    void **keep = malloc(64 * sizeof *keep);
    for (int i = 0; i < 64; i++)
        keep[i] = malloc(256);
    sink = keep;
    sem_post(&step_done);
    for (;;) {
        sem_wait(&grow_request);
        void *p[2000];
        for (int i = 0; i < 2000; i++) {
            p[i] = malloc(1024 + (size_t)(rand_r(&seed) % 3072));
            memset(p[i], 0x47, 64);
        }
        for (int i = 0; i < 2000; i += 2)
            free(p[i]);
        sink = p[1];
        sem_post(&step_done);
    }
    return NULL;
}

static void *steady(void *arg)
{
    (void)arg;
    steady_tid = gettid();
    void **keep = malloc(64 * sizeof *keep);
    for (int i = 0; i < 64; i++)
        keep[i] = malloc(512);
    sink = keep;
    sem_post(&step_done);
    for (;;)
        pause();
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: grow DIR\n");
        return 2;
    }
    dir = argv[1];
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);  /* inherited by the workers: only sigwait below takes them */
    sem_init(&grow_request, 0, 0);
    sem_init(&step_done, 0, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, grower, NULL) || pthread_create(&t, NULL, steady, NULL)) {
        fprintf(stderr, "grow: cannot start the workers\n");
        return 1;
    }
    sem_wait(&step_done);
    sem_wait(&step_done);
    int step = 0;
    write_state(step);
    for (;;) {
        int sig;
        sigwait(&set, &sig);
        if (sig == SIGTERM)
            return 0;
        sem_post(&grow_request);
        sem_wait(&step_done);
        write_state(++step);
    }
}
