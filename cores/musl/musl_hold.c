/* musl_hold: a process on musl's malloc (mallocng) holding memory of every kind it serves, with the ledger of
 * every allocation alive at its snapshot (musl keeps no statistics: the ledger is the oracle).
 *
 * Usage: musl_hold DIR.  THREADS threads (MUSL_HOLD_THREADS, 4 by default) each allocate ROUNDS (MUSL_HOLD_ROUNDS,
 * 6000) requests of sizes drawn across musl's small and medium classes (1 byte to 120 KiB), and a few above its
 * mmap threshold (each then mapped on its own), some by aligned_alloc and realloc; each frees about two out of
 * three of its requests in a scattered order, so that groups are left partly free, some wholly.  Then the main
 * thread writes DIR/ledger.json with write(2) from a static buffer (every live allocation: its address and the
 * size asked for; what the program freed wholly, the mapped ones), and stops itself (SIGSTOP); threads stay
 * parked.  Nothing allocates but the program's own requests (snprintf into static buffers, write(2)).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LIVE 200000
#define MAX_THREADS 32

struct entry { uintptr_t address; size_t size; };

static struct entry live[MAX_LIVE];
static size_t nlive;
static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t parked;
static int rounds = 6000;

static uint64_t next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* A request's size: mostly small, some medium, one in 400 above the mmap threshold. */
static size_t draw_size(uint64_t *state)
{
    uint64_t r = next_random(state);
    switch (r % 400) {
    case 0: return 131072 + (r >> 20) % (3 << 20);
    case 1: case 2: case 3: case 4: case 5: case 6: case 7: case 8: return 2048 + (r >> 20) % 120000;
    default: break;
    }
    if (r % 7 == 0)
        return 256 + (r >> 20) % 1800;
    return 1 + (r >> 20) % 240;
}

static void *request(uint64_t *state, size_t *size)
{
    uint64_t r = next_random(state);
    *size = draw_size(state);
    void *p;
    if (r % 97 == 0) {
        p = aligned_alloc(64 << (r >> 8) % 6, *size);
    } else if (r % 89 == 0) {
        p = malloc(*size / 2 + 1);
        if (p)
            memset(p, 0x5a, *size / 2 + 1);
        p = realloc(p, *size);
    } else {
        p = malloc(*size);
    }
    if (!p) {
        write(2, "musl_hold: out of memory\n", 25);
        _exit(3);
    }
    memset(p, 0xa5, *size);
    return p;
}

static void *worker(void *arg)
{
    uint64_t state = 0x9e3779b97f4a7c15ull * ((uintptr_t)arg + 1);
    void **held = calloc(rounds, sizeof *held);
    size_t *sizes = calloc(rounds, sizeof *sizes);
    if (!held || !sizes)
        _exit(3);
    for (int i = 0; i < rounds; i++)
        held[i] = request(&state, &sizes[i]);
    for (int i = 0; i < rounds; i++) {
        int j = (int)(((uint64_t)i * 7919) % (uint64_t)rounds);     /* a scattered order */
        if (j % 3 != 0 || (j / 500) % 5 == 4) {                      /* every fifth run of 500 wholly */
            free(held[j]);
            held[j] = NULL;
        }
    }
    pthread_mutex_lock(&ledger_lock);
    for (int i = 0; i < rounds; i++) {
        if (held[i] && nlive < MAX_LIVE) {
            live[nlive].address = (uintptr_t)held[i];
            live[nlive].size = sizes[i];
            nlive++;
        }
    }
    live[nlive].address = (uintptr_t)held;
    live[nlive++].size = rounds * sizeof *held;
    live[nlive].address = (uintptr_t)sizes;
    live[nlive++].size = rounds * sizeof *sizes;
    pthread_mutex_unlock(&ledger_lock);
    pthread_barrier_wait(&parked);
    for (;;)
        pause();
    return NULL;
}

static char text[MAX_LIVE * 48 + 4096];

static void write_ledger(const char *dir, int threads)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/ledger.json", dir);
    size_t n = (size_t)snprintf(text, sizeof text, "{\"pid\": %d, \"threads\": %d, \"live\": [", (int)getpid(),
                                threads);
    for (size_t i = 0; i < nlive; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s[%lu, %lu]", i ? ", " : "",
                              (unsigned long)live[i].address, (unsigned long)live[i].size);
    n += (size_t)snprintf(text + n, sizeof text - n, "]}\n");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, text, n) != (ssize_t)n || close(fd) != 0)
        _exit(4);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        write(2, "usage: musl_hold DIR\n", 21);
        return 2;
    }
    const char *t = getenv("MUSL_HOLD_THREADS"), *r = getenv("MUSL_HOLD_ROUNDS");
    int threads = t ? atoi(t) : 4;
    if (threads < 1 || threads > MAX_THREADS)
        threads = 4;
    if (r && atoi(r) > 0)
        rounds = atoi(r);
    pthread_t ids[MAX_THREADS];
    pthread_barrier_init(&parked, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&ids[i], NULL, worker, (void *)(uintptr_t)i) != 0)
            _exit(5);
    pthread_barrier_wait(&parked);
    write_ledger(argv[1], threads);
    raise(SIGSTOP);
    return 0;
}
