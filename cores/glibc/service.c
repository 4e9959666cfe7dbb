/* service: a multi-threaded service whose thread arenas fill with free memory, for `heapwalk capture` on a
 * running process, and malloc_trim(0) done for real.
 *
 * Usage: service DIR [THREADS].  THREADS workers (16 unless given) each allocate about 2 MiB in chunks of
 * 1-8 KiB, free three of every four (holes that do not coalesce, in pages that stay resident), and keep
 * the rest; then every worker waits.  On a machine with 2 CPUs the 16 workers and the main thread reach
 * glibc's default arena limit (8 x CPUs).  The process keeps running: each SIGUSR2 makes the main thread call
 * malloc_trim(0).  It writes DIR/state once the workers are done and after each trim:
 * "STEP RSS_BEFORE RSS_AFTER TRIMMED" (step 0 at the start; RSS from /proc/self/statm, in bytes, read just
 * before and just after malloc_trim; TRIMMED its return value), with write(2) from a buffer on the stack.
 * SIGTERM ends it.  Each worker names itself "worker-N" (pthread_setname_np), as a service's pool would.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNKS 200

static const char *dir;
static sem_t ready;
static pthread_barrier_t all_allocated;

static long rss_bytes(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY);
    long size = 0, resident = 0;
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    if (sscanf(buf, "%ld %ld", &size, &resident) != 2)
        return -1;
    return resident * sysconf(_SC_PAGESIZE);
}

static void write_state(int step, long before, long after, int trimmed)
{
    char path[4096], tmp[4200], line[128];
    snprintf(path, sizeof path, "%s/state", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(tmp);
        exit(1);
    }
    int n = snprintf(line, sizeof line, "%d %ld %ld %d\n", step, before, after, trimmed);
    if (write(fd, line, n) != n) {
        perror(tmp);
        exit(1);
    }
    close(fd);
    rename(tmp, path);
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(long)arg * 2654435761u + 1;
    char name[16];
    snprintf(name, sizeof name, "worker-%ld", (long)arg);
    pthread_setname_np(pthread_self(), name);
    void *kept[CHUNKS];
    void *all[CHUNKS * 4];
    for (int i = 0; i < CHUNKS * 4; i++) {
        size_t size = 1024 + rand_r(&seed) % 7168;
        all[i] = malloc(size);
        memset(all[i], 0x5a, size);
    }
    for (int i = 0; i < CHUNKS * 4; i++) {
        if (i % 4 == 3)
            kept[i / 4] = all[i];
        else
            free(all[i]);
    }
    pthread_barrier_wait(&all_allocated);
    sem_wait(&ready);           /* never posted: the worker keeps its arena and its chunks */
    (void)kept;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: service DIR [THREADS]\n");
        return 2;
    }
    dir = argv[1];
    int threads = argc > 2 ? atoi(argv[2]) : 16;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    sem_init(&ready, 0, 0);
    pthread_barrier_init(&all_allocated, NULL, threads + 1);
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        pthread_create(&t, NULL, worker, (void *)(long)i);
    }
    pthread_barrier_wait(&all_allocated);
    write_state(0, rss_bytes(), rss_bytes(), 0);
    for (int step = 1;; step++) {
        int sig;
        sigwait(&set, &sig);
        if (sig == SIGTERM)
            return 0;
        long before = rss_bytes();
        int trimmed = malloc_trim(0);
        long after = rss_bytes();
        write_state(step, before, after, trimmed);
    }
}
