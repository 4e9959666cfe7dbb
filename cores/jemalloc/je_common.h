/* What the jemalloc reproducers share: jemalloc's entry points found at run time (they run with
 * LD_PRELOAD=libjemalloc.so.2; or linked with it, JE_LINKED; or loading it with dlopen, JE_DLOPEN), a ledger
 * of the threads, and the snapshot: the main thread moves to an
 * arena of its own, writes malloc_stats_print(..., "J") into stats.json and the ledger into ledger.json,
 * and stops itself with SIGSTOP for gcore.
 *
 * malloc_stats_print is called twice and the second output kept: the first sets up what the statistics
 * code allocates once.  jemalloc 5.3's malloc_stats_print writes through a 64 KiB buffer it takes from
 * arena 0 and frees when done, so arena 0 would hold 16 dirty pages more than the statistics printed.
 * The snapshot takes the same buffer from arena 0 again (mallocx, no tcache), which puts arena 0's pages
 * back as they were printed; the ledger says so ("stats_buffer"), because arena 0's large counters then
 * count that one allocation and the printer's free on top, and its "internal" bytes counted the buffer
 * while it printed, and no longer do ("internal": true in the ledger).
 * (jemalloc 5.1 and 5.2, and builds with --enable-debug, print without such a buffer.)  Everything is
 * written with write(2) from static buffers.
 *
 * With JE_BACKGROUND=1 in its environment the snapshot first turns jemalloc's background threads on at run time
 * (mallctl "background_thread", as Redis does; opt.background_thread stays false) and waits until they run;
 * every ledger says whether they run at the snapshot ("background_thread", as mallctl reads it).  Those threads
 * may purge while the statistics print: such a capture is for the state of the background threads, not for
 * the figures.
 */
#ifndef JE_COMMON_H
#define JE_COMMON_H

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

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef void (*stats_fn)(void (*)(void *, const char *), void *, const char *);
typedef void *(*mallocx_fn)(size_t, int);

#define STATS_BUFFER 65536                    /* jemalloc 5.3's STATS_PRINT_BUFSIZE */
#define ARENA_0_NO_TCACHE ((1 << 20) | (1 << 8)) /* MALLOCX_ARENA(0) | MALLOCX_TCACHE_NONE */

static mallctl_fn repro_mallctl;
static stats_fn repro_stats_print;
static char ledger[16384];
static size_t ledger_len;
static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;

static void die(const char *what) {
    write(2, what, strlen(what));
    write(2, "\n", 1);
    _exit(3);
}

#ifdef JE_LINKED
/* jemalloc linked into the program (JE_LINKED), its entry points named with JE_PREFIX (empty, je_, ...) */
#define JE_JOIN2(a, b) a##b
#define JE_JOIN(a, b) JE_JOIN2(a, b)
#define JE_NAME(n) JE_JOIN(JE_PREFIX, n)
int JE_NAME(mallctl)(const char *, void *, size_t *, void *, size_t);
void JE_NAME(malloc_stats_print)(void (*)(void *, const char *), void *, const char *);
void *JE_NAME(mallocx)(size_t, int);
#define JE_LOOKUP(n) ((void *)JE_NAME(n))
/* the program allocates from jemalloc under its prefix, as Redis calls je_malloc */
void *JE_NAME(malloc)(size_t);
void *JE_NAME(realloc)(void *, size_t);
void JE_NAME(free)(void *);
#define malloc(n) JE_NAME(malloc)(n)
#define realloc(p, n) JE_NAME(realloc)(p, n)
#define free(p) JE_NAME(free)(p)
#elif defined(JE_DLOPEN)
/* jemalloc loaded as a plugin loads it: dlopen(JE_LIBRARY, RTLD_LOCAL), its entry points through the handle
 * (the program's own malloc stays glibc's; what it allocates from jemalloc goes through these) */
static void *je_handle;
static void *(*je_malloc_fn)(size_t);
static void *(*je_realloc_fn)(void *, size_t);
static void (*je_free_fn)(void *);
#define JE_LOOKUP(n) dlsym(je_handle, #n)
#define malloc(n) je_malloc_fn(n)
#define realloc(p, n) je_realloc_fn(p, n)
#define free(p) je_free_fn(p)
#else
#define JE_LOOKUP(n) dlsym(RTLD_DEFAULT, #n)
#endif

/* Finds mallctl and malloc_stats_print, or dies saying jemalloc is not loaded. */
static void je_find(void) {
#ifdef JE_DLOPEN
    const char *library = getenv("JE_LIBRARY");
    if (library == NULL || (je_handle = dlopen(library, RTLD_NOW | RTLD_LOCAL)) == NULL)
        die("cannot dlopen the jemalloc that JE_LIBRARY names");
    je_malloc_fn = (void *(*)(size_t))JE_LOOKUP(malloc);
    je_realloc_fn = (void *(*)(void *, size_t))JE_LOOKUP(realloc);
    je_free_fn = (void (*)(void *))JE_LOOKUP(free);
    if (je_malloc_fn == NULL || je_realloc_fn == NULL || je_free_fn == NULL)
        die("the jemalloc JE_LIBRARY names has no malloc, realloc or free");
#endif
    repro_mallctl = (mallctl_fn)JE_LOOKUP(mallctl);
    repro_stats_print = (stats_fn)JE_LOOKUP(malloc_stats_print);
    if (repro_mallctl == NULL || repro_stats_print == NULL)
        die("jemalloc is not loaded (run with LD_PRELOAD=libjemalloc.so.2)");
}

static unsigned thread_arena(void) {
    unsigned arena = 0;
    size_t len = sizeof arena;
    if (repro_mallctl("thread.arena", &arena, &len, NULL, 0) != 0)
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

/* Moves the calling thread to an arena of its own (arenas.create, thread.arena), or dies. */
__attribute__((unused)) static void je_own_arena(void) {
    unsigned own = 0;
    size_t len = sizeof own;
    if (repro_mallctl("arenas.create", &own, &len, NULL, 0) != 0 ||
        repro_mallctl("thread.arena", NULL, NULL, &own, sizeof own) != 0)
        die("cannot move a thread to an arena of its own");
}

/* A worker's end: noted in the ledger as ROLE with its arena, then parked at the barrier PARKED until the
 * snapshot. */
__attribute__((unused)) static void *je_park(const char *role, pthread_barrier_t *parked) {
    note_thread(role, thread_arena());
    pthread_barrier_wait(parked);
    pause();
    return NULL;
}

/* A thread that never calls jemalloc (its tsd is never set up; with jemalloc loaded by dlopen, its thread
 * vector has no block of jemalloc's TLS module at all): noted, then parked at the barrier PARKED. */
__attribute__((unused)) static void *je_idle(void *parked) {
    note_thread("idle", -1);
    pthread_barrier_wait((pthread_barrier_t *)parked);
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

/* The main thread's snapshot (see the top of this file), into STATS_FD and LEDGER_FD; stops the process. */
static void je_snapshot(int stats_fd, int ledger_fd) {
    unsigned own = 0;
    size_t len = sizeof own;
    _Bool background = 0;
    size_t blen = sizeof background;
    const char *turn_on = getenv("JE_BACKGROUND");
    if (turn_on != NULL && turn_on[0] == '1') {
        _Bool on = 1;
        if (repro_mallctl("background_thread", NULL, NULL, &on, sizeof on) != 0)
            die("mallctl background_thread (write) failed");
        usleep(200000);                       /* the first background thread starts the others it needs */
    }
    if (repro_mallctl("background_thread", &background, &blen, NULL, 0) != 0)
        die("mallctl background_thread failed");
    if (repro_mallctl("arenas.create", &own, &len, NULL, 0) != 0)
        die("mallctl arenas.create failed");
    note_thread("main", thread_arena());
    if (repro_mallctl("thread.arena", NULL, NULL, &own, sizeof own) != 0)
        die("mallctl thread.arena (write) failed");
    repro_stats_print(write_stats, (void *)(long)stats_fd, "J");
    if (ftruncate(stats_fd, 0) != 0 || lseek(stats_fd, 0, SEEK_SET) != 0)
        die("cannot rewrite stats.json");
    repro_stats_print(write_stats, (void *)(long)stats_fd, "J");
    close(stats_fd);
    const char *version = NULL;
    size_t vlen = sizeof version;
    if (repro_mallctl("version", &version, &vlen, NULL, 0) != 0)
        die("mallctl version failed");
    /* 5.3 and later print through the buffer; 5.1 and 5.2, and debug builds, write straight to the callback */
    _Bool debug = 0;
    size_t dlen = sizeof debug;
    if (repro_mallctl("config.debug", &debug, &dlen, NULL, 0) != 0)
        die("mallctl config.debug failed");
    int buffer_taken = !debug && (version[0] > '5' || (version[0] == '5' && version[2] >= '3'));
    if (buffer_taken) {
        mallocx_fn repro_mallocx = (mallocx_fn)JE_LOOKUP(mallocx);
        if (repro_mallocx == NULL || repro_mallocx(STATS_BUFFER, ARENA_0_NO_TCACHE) == NULL)
            die("mallocx of the statistics buffer failed");
    }
    size_t max_background_threads = 0;
    len = sizeof max_background_threads;
    if (repro_mallctl("opt.max_background_threads", &max_background_threads, &len, NULL, 0) != 0)
        die("mallctl opt.max_background_threads failed");
    char tail[360];
    int n = snprintf(tail, sizeof tail, "\n ],\n \"stats_arena\": %u,\n \"opt.max_background_threads\": %zu,"
                     "\n \"background_thread\": %s,\n \"stats_buffer\": %s\n}\n", own, max_background_threads,
                     background ? "true" : "false",
                     buffer_taken ? "{\"arena\": 0, \"size\": 65536, \"internal\": true, \"retaken\": true}"
                                  : "null");
    write_stats((void *)(long)ledger_fd, "{\n \"threads\": [\n  ");
    write_stats((void *)(long)ledger_fd, ledger);
    write(ledger_fd, tail, (size_t)n);
    close(ledger_fd);
    raise(SIGSTOP);
}

#endif
