/* A program on gperftools' tcmalloc (issue 42), run with LD_PRELOAD=libtcmalloc_minimal.so.4 (or the full
 * libtcmalloc.so.4), or linked with libtcmalloc_minimal.a (built with -DTC_LINKED):
 * one thread allocates blocks of many size classes and some large ones, frees two thirds of them in a
 * scattered order and exits (its cache goes back to the central lists; the blocks it kept are leaked: it clears
 * its array of them); then four more do the same and park (their thread caches keep what they freed; they
 * clear each freed block's address).  Each thread writes the blocks it kept (address and size, in hex text,
 * which no scan takes for a pointer) to ledger-N.txt, after a line that says whether it exits and the last
 * block it freed.  Then the main thread writes tcmalloc's own statistics at that
 * instant into stats.json in the folder given as its one argument: tc_version's string, every MallocExtension
 * numeric property heapwalk shows, and MallocExtension_GetStats's text; and stops itself (SIGSTOP) for the
 * capture.  Continued, it measures what MallocExtension_ReleaseFreeMemory() really gives back (RssAnon before
 * and after, into release.json) and exits.  Its entry points are found with dlsym (called directly when
 * linked); everything is written with write(2) from static buffers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 5
#define BLOCKS 20000

typedef int (*property_fn)(const char *, size_t *);
typedef void (*stats_fn)(char *, int);
typedef const char *(*version_fn)(int *, int *, const char **);
typedef void (*release_fn)(void);

#ifdef TC_LINKED
int MallocExtension_GetNumericProperty(const char *, size_t *);
void MallocExtension_GetStats(char *, int);
void MallocExtension_ReleaseFreeMemory(void);
const char *tc_version(int *, int *, const char **);
#define ENTRY(name) ((void *)&name)
#else
#define ENTRY(name) dlsym(RTLD_DEFAULT, #name)
#endif

static const char *const properties[] = {
    "generic.current_allocated_bytes", "generic.heap_size", "generic.total_physical_bytes",
    "tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes", "tcmalloc.central_cache_free_bytes",
    "tcmalloc.transfer_cache_free_bytes", "tcmalloc.thread_cache_free_bytes",
    "tcmalloc.current_total_thread_cache_bytes", "tcmalloc.max_total_thread_cache_bytes",
    "tcmalloc.slack_bytes", "tcmalloc.aggressive_memory_decommit", "tcmalloc.pageheap_committed_bytes",
};
#define NPROPERTIES (sizeof properties / sizeof properties[0])

static char text[1 << 20];
static char out[(1 << 21) + 8192];
static const char *folder;
static char ledgers[THREADS][1 << 19];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t parked_cond = PTHREAD_COND_INITIALIZER;
static int parked;

static size_t size_of(unsigned i)
{
    static const size_t sizes[] = {8, 16, 24, 32, 48, 64, 96, 128, 200, 256, 400, 512, 1000, 1024, 2048, 4096,
                                   7000, 8192, 20000, 65536};
    return i % 97 == 0 ? (size_t)(300 + i % 5) << 10 : sizes[(i * 7919u) % (sizeof sizes / sizeof sizes[0])];
}

/* Writes the blocks thread T kept (every third of BLOCKS) to FOLDER/ledger-T.txt, after a first line that says
 * whether it exits and the address of the last block it freed. */
static void write_ledger(long t, int exits, char *const *blocks, unsigned long freed)
{
    char *text = ledgers[t];
    size_t at = (size_t)snprintf(text, sizeof ledgers[t], "%s %lx\n", exits ? "exits" : "parks", freed);
    for (unsigned j = 0; j < BLOCKS; j += 3)
        at += (size_t)snprintf(text + at, sizeof ledgers[t] - at, "%lx %zx\n", (unsigned long)blocks[j], size_of(j));
    char path[4096];
    snprintf(path, sizeof path, "%s/ledger-%ld.txt", folder, t);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, text, at) != (ssize_t)at)
        abort();
    close(fd);
}

static void *worker(void *arg)
{
    long t = (long)arg;
    int exits = t == THREADS - 1;
    char *blocks[BLOCKS];
    for (unsigned i = 0; i < BLOCKS; i++) {
        size_t size = size_of(i);
        blocks[i] = malloc(size);
        if (blocks[i] == NULL)
            abort();
        memset(blocks[i], (int)i, size < 64 ? size : 64);
    }
    unsigned long freed = 0;
    for (unsigned i = 0; i < BLOCKS; i++) {
        unsigned j = (i * 7u) % BLOCKS;           /* scattered */
        if (j % 3) {
            freed = (unsigned long)blocks[j];
            free(blocks[j]), blocks[j] = NULL;    /* no stale address: the scan would take it for a reference */
        }
    }
    write_ledger(t, exits, blocks, freed);
    pthread_mutex_lock(&lock);
    parked++;
    pthread_cond_signal(&parked_cond);
    pthread_mutex_unlock(&lock);
    if (exits) {
        explicit_bzero(blocks, sizeof blocks);     /* its kept blocks are leaked: no copy of their address stays */
        return NULL;
    }
    for (;;)
        pause();
}

static size_t append(size_t at, const char *s)
{
    size_t n = strlen(s);
    if (at + n < sizeof out) {
        memcpy(out + at, s, n);
        at += n;
    }
    return at;
}

/* TEXT as a JSON string (quotes, backslashes and control characters escaped). */
static size_t append_string(size_t at, const char *s)
{
    at = append(at, "\"");
    for (; *s && at + 8 < sizeof out; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[at++] = '\\';
            out[at++] = (char)c;
        } else if (c < 0x20) {
            at += (size_t)snprintf(out + at, 8, "\\u%04x", c);
        } else {
            out[at++] = (char)c;
        }
    }
    return append(at, "\"");
}

/* The process's anonymous resident bytes (RssAnon of /proc/self/status), or -1. */
static long rss_anon(void)
{
    static char buf[8192];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *line = strstr(buf, "RssAnon:");
    return line ? strtol(line + 8, NULL, 10) * 1024 : -1;
}

/* After the capture: what a release really gives back, into release.json in FOLDER. */
static int measure_release(const char *folder, release_fn release, property_fn property)
{
    static char path[4096];
    static char line[512];
    size_t free_before = 0, free_after = 0, unmapped_after = 0;
    property("tcmalloc.pageheap_free_bytes", &free_before);
    long before = rss_anon();
    release();
    long after = rss_anon();
    property("tcmalloc.pageheap_free_bytes", &free_after);
    property("tcmalloc.pageheap_unmapped_bytes", &unmapped_after);
    snprintf(path, sizeof path, "%s/release.json", folder);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return 1;
    int n = snprintf(line, sizeof line, "{\"rss_anon_before\": %ld, \"rss_anon_after\": %ld, "
                     "\"pageheap_free_before\": %zu, \"pageheap_free_after\": %zu, "
                     "\"pageheap_unmapped_after\": %zu}\n", before, after, free_before, free_after, unmapped_after);
    return write(fd, line, (size_t)n) != n || close(fd) != 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    property_fn property = (property_fn)ENTRY(MallocExtension_GetNumericProperty);
    stats_fn stats = (stats_fn)ENTRY(MallocExtension_GetStats);
    version_fn version = (version_fn)ENTRY(tc_version);
    release_fn release = (release_fn)ENTRY(MallocExtension_ReleaseFreeMemory);
    if (property == NULL || stats == NULL || version == NULL || release == NULL)
        return 3;
    folder = argv[1];
    pthread_t threads[THREADS];
    /* the exiting thread first, alone: no other thread ever held the blocks it leaks, so no stale copy of
     * their addresses is left anywhere */
    if (pthread_create(&threads[THREADS - 1], NULL, worker, (void *)(long)(THREADS - 1)) != 0 ||
        pthread_join(threads[THREADS - 1], NULL) != 0)
        return 1;
    for (long t = 0; t < THREADS - 1; t++)
        if (pthread_create(&threads[t], NULL, worker, (void *)t) != 0)
            return 1;
    pthread_mutex_lock(&lock);
    while (parked < THREADS)
        pthread_cond_wait(&parked_cond, &lock);
    pthread_mutex_unlock(&lock);

    static char path[4096];
    snprintf(path, sizeof path, "%s/stats.json", argv[1]);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return 1;
    static size_t values[NPROPERTIES];
    static int known[NPROPERTIES];
    for (size_t i = 0; i < NPROPERTIES; i++)
        known[i] = property(properties[i], &values[i]);
    stats(text, sizeof text);
    size_t at = append(0, "{\"version\": ");
    at = append_string(at, version(NULL, NULL, NULL));
    at = append(at, ", \"properties\": {");
    size_t opened = at;
    static char line[256];
    for (size_t i = 0; i < NPROPERTIES; i++) {
        if (known[i]) {
            snprintf(line, sizeof line, "%s\"%s\": %zu", at > opened ? ", " : "", properties[i], values[i]);
            at = append(at, line);
        }
    }
    at = append(at, "}, \"stats\": ");
    at = append_string(at, text);
    at = append(at, "}\n");
    if (write(fd, out, at) != (ssize_t)at)
        return 1;
    close(fd);
    kill(getpid(), SIGSTOP);
    return measure_release(argv[1], release, property);
}
