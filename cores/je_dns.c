/* jemalloc reproducer: the DNS-server pattern.  Run with LD_PRELOAD=libjemalloc.so.2.
 *
 * Worker threads each build tens of thousands of small objects (a JSON document
 * of a zone), serialise them into a buffer that doubles with realloc up to
 * several MiB, and free it all.  Half of the workers start with free(): their
 * first call into the allocator frees a block the main thread allocated for
 * them (in jemalloc <= 5.2.1 such a thread never sets up the ticker that
 * drives decay, so its arena's dirty pages are not purged).  A last thread
 * never allocates.  JE_DNS_ROUNDS (default 1) zones are built by each worker,
 * JE_DNS_PAUSE_MS apart, so that with a short dirty_decay_ms time passes and
 * the arenas whose threads hold a decay ticker purge.
 *
 * At the snapshot the workers are parked; the main thread binds itself to an
 * arena of its own (so the buffer malloc_stats_print allocates lands there),
 * writes malloc_stats_print(..., "J") twice into stats.json (the second one is
 * kept: the first sets up what the statistics code allocates once), a ledger
 * of the threads (ledger.json), and stops itself with SIGSTOP for gcore.
 *
 * jemalloc 5.3's malloc_stats_print writes through a 64 KiB buffer it takes
 * from arena 0 and frees when done, so arena 0 would hold 16 dirty pages more
 * than the statistics printed.  The reproducer takes the same buffer from
 * arena 0 again (mallocx, no tcache), which puts arena 0's pages back as they
 * were printed; the ledger says so ("stats_buffer"), because arena 0's large
 * counters then count that one allocation and the printer's free on top, and
 * its "internal" bytes counted the buffer while it printed, and no longer do
 * ("internal": true in the ledger).
 * Everything is written with write(2) from static buffers.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WORKERS 6
#define OBJECTS 20000

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef void (*stats_fn)(void (*)(void *, const char *), void *, const char *);
typedef void *(*mallocx_fn)(size_t, int);

#define STATS_BUFFER 65536                    /* jemalloc 5.3's STATS_PRINT_BUFSIZE */
#define ARENA_0_NO_TCACHE ((1 << 20) | (1 << 8)) /* MALLOCX_ARENA(0) | MALLOCX_TCACHE_NONE */

static mallctl_fn je_mallctl;
static stats_fn je_stats_print;
static pthread_barrier_t parked;
static void *first_blocks[WORKERS];
static char ledger[16384];
static size_t ledger_len;
static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;

static void die(const char *what) {
    write(2, what, strlen(what));
    write(2, "\n", 1);
    _exit(3);
}

static unsigned thread_arena(void) {
    unsigned arena = 0;
    size_t len = sizeof arena;
    if (je_mallctl("thread.arena", &arena, &len, NULL, 0) != 0)
        die("mallctl thread.arena failed");
    return arena;
}

static void note_thread(const char *role, long arena) {
    pthread_mutex_lock(&ledger_lock);
    ledger_len += (size_t)snprintf(ledger + ledger_len, sizeof ledger - ledger_len,
                                   "%s{\"role\": \"%s\", \"lwp\": %ld, \"arena\": %ld}",
                                   ledger_len ? ",\n  " : "", role, (long)syscall(SYS_gettid), arena);
    pthread_mutex_unlock(&ledger_lock);
}

/* The zone as tens of thousands of small objects, serialised by realloc doubling, then freed. */
static void build_and_serialise(unsigned seed) {
    static __thread void *objects[OBJECTS];
    for (int i = 0; i < OBJECTS; i++) {
        size_t n = 24 + (size_t)((seed * 2654435761u + (unsigned)i * 40503u) % 200);
        objects[i] = malloc(n);
        if (objects[i] == NULL)
            die("malloc failed");
        memset(objects[i], 0x5a, n);
    }
    size_t cap = 1024, used = 0;
    char *buffer = malloc(cap);
    for (int i = 0; i < OBJECTS; i++) {
        if (used + 256 > cap) {
            cap *= 2;
            buffer = realloc(buffer, cap);
            if (buffer == NULL)
                die("realloc failed");
        }
        memcpy(buffer + used, objects[i], 24);   /* every object holds at least 24 bytes */
        memset(buffer + used + 24, ' ', 176);
        used += 200;
    }
    for (int i = 0; i < OBJECTS; i++)
        free(objects[i]);
    free(buffer);
}

static int rounds = 1;       /* JE_DNS_ROUNDS: zones each worker builds, JE_DNS_PAUSE_MS apart */
static int pause_ms;

static void *worker(void *arg) {
    long id = (long)arg;
    int free_first = id % 2 == 0;
    if (free_first)
        free(first_blocks[id]);  /* the thread's first call into the allocator */
    for (int r = 0; r < rounds; r++) {
        if (r > 0 && pause_ms > 0)
            usleep((useconds_t)pause_ms * 1000);
        build_and_serialise((unsigned)(id + 1 + r * WORKERS));
    }
    if (!free_first)
        free(first_blocks[id]);
    note_thread(free_first ? "free_first" : "malloc_first", thread_arena());
    pthread_barrier_wait(&parked);
    pause();
    return NULL;
}

static void *idle(void *arg) {
    (void)arg;
    note_thread("idle", -1);
    pthread_barrier_wait(&parked);
    pause();
    return NULL;
}

static void write_stats(void *fd, const char *text) {
    size_t n = strlen(text);
    while (n) {
        ssize_t w = write((int)(long)fd, text, n);
        if (w <= 0)
            die("write failed");
        text += w;
        n -= (size_t)w;
    }
}

static int open_out(const char *dir, const char *name) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die("cannot open an output file");
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 2)
        die("usage: je_dns OUTDIR");
    je_mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    je_stats_print = (stats_fn)dlsym(RTLD_DEFAULT, "malloc_stats_print");
    if (je_mallctl == NULL || je_stats_print == NULL)
        die("jemalloc is not loaded (run with LD_PRELOAD=libjemalloc.so.2)");
    if (getenv("JE_DNS_ROUNDS"))
        rounds = atoi(getenv("JE_DNS_ROUNDS"));
    if (getenv("JE_DNS_PAUSE_MS"))
        pause_ms = atoi(getenv("JE_DNS_PAUSE_MS"));
    int stats_fd = open_out(argv[1], "stats.json"), ledger_fd = open_out(argv[1], "ledger.json");
    for (long i = 0; i < WORKERS; i++)
        first_blocks[i] = malloc(64 + 16 * (size_t)i);
    pthread_barrier_init(&parked, NULL, WORKERS + 2);
    pthread_t threads[WORKERS + 1];
    for (long i = 0; i < WORKERS; i++)
        if (pthread_create(&threads[i], NULL, worker, (void *)i) != 0)
            die("pthread_create failed");
    if (pthread_create(&threads[WORKERS], NULL, idle, NULL) != 0)
        die("pthread_create failed");
    pthread_barrier_wait(&parked);

    unsigned own = 0;
    size_t len = sizeof own;
    if (je_mallctl("arenas.create", &own, &len, NULL, 0) != 0)
        die("mallctl arenas.create failed");
    note_thread("main", thread_arena());
    if (je_mallctl("thread.arena", NULL, NULL, &own, sizeof own) != 0)
        die("mallctl thread.arena (write) failed");
    je_stats_print(write_stats, (void *)(long)stats_fd, "J");
    if (ftruncate(stats_fd, 0) != 0 || lseek(stats_fd, 0, SEEK_SET) != 0)
        die("cannot rewrite stats.json");
    je_stats_print(write_stats, (void *)(long)stats_fd, "J");
    close(stats_fd);
    const char *version = NULL;
    size_t vlen = sizeof version;
    if (je_mallctl("version", &version, &vlen, NULL, 0) != 0)
        die("mallctl version failed");
    int buffer_taken = strncmp(version, "5.2.", 4) != 0;
    if (buffer_taken) {
        mallocx_fn je_mallocx = (mallocx_fn)dlsym(RTLD_DEFAULT, "mallocx");
        if (je_mallocx == NULL || je_mallocx(STATS_BUFFER, ARENA_0_NO_TCACHE) == NULL)
            die("mallocx of the statistics buffer failed");
    }
    size_t max_background_threads = 0;
    len = sizeof max_background_threads;
    if (je_mallctl("opt.max_background_threads", &max_background_threads, &len, NULL, 0) != 0)
        die("mallctl opt.max_background_threads failed");
    char tail[320];
    int n = snprintf(tail, sizeof tail, "\n ],\n \"stats_arena\": %u,\n \"opt.max_background_threads\": %zu,"
                     "\n \"stats_buffer\": %s\n}\n", own, max_background_threads,
                     buffer_taken ? "{\"arena\": 0, \"size\": 65536, \"internal\": true, \"retaken\": true}"
                                  : "null");
    write_stats((void *)(long)ledger_fd, "{\n \"threads\": [\n  ");
    write_stats((void *)(long)ledger_fd, ledger);
    write(ledger_fd, tail, (size_t)n);
    close(ledger_fd);
    raise(SIGSTOP);
    return 0;
}
