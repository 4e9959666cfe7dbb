/* A program on mimalloc (issue 43), run with LD_PRELOAD=libmimalloc.so.N, or linked with mimalloc's objects
 * (built with -DMI_LINKED):
 * four threads allocate blocks of many sizes (small, medium, large and one huge), free two thirds of them in a
 * scattered order and park; the blocks they keep stay in their arrays.  Then one more does the same alone and
 * exits: its segments are abandoned with the blocks it kept, which are leaked (it clears its array of them), and
 * no thread allocates after it (which would reclaim them).  Each thread
 * writes ledger-N.txt: a first line "exits"/"parks" and its default heap's address, then, from
 * mi_heap_visit_blocks over its heap (from 3.2 mi_theap_visit_blocks over its theap; linked: -DMI_THEAP), one
 * line per area ("a START RESERVED COMMITTED USED BLOCK_SIZE") and one per block in use ("b ADDRESS SIZE"), and its huge block ("k ADDRESS SIZE": mi_usable_size); after the walk it
 * frees a few more blocks (lines "f ADDRESS": they wait on the page's local free list), and lists every block it
 * keeps ("l ADDRESS SIZE", mi_usable_size: mimalloc 3 gives up full pages of live threads, which the walk of
 * its heap does not see).  From 3.2 (theaps), the main thread walks every parked thread's theap, and its own,
 * again at the snapshot, into snapshot-N.txt and snapshot-main.txt (a first line "now THEAP", then "a" and "b"
 * lines): a thread that frees a block in a page another gave up takes the page.  Once all are parked, the main thread walks its own heap the same way into
 * ledger-main.txt, then frees some of thread 0's blocks (lines "f ADDRESS" there: they wait on the page's
 * thread-free list) and writes mimalloc's own statistics at that instant into stats.json in the folder given
 * as its one argument: mi_version, mi_process_info, and mi_stats_print_out's text (each thread merged its
 * statistics first); and stops itself (SIGSTOP) for the capture.  With MI_HOLD_CACHE set, the exiting thread
 * also fills and frees whole segments; with MI_HOLD_MAIN, the main thread first frees most of what it allocated
 * (`churn`).  Continued, it measures what mi_collect(true)
 * really gives back (RssAnon and mi_process_info's commit before and after, into collect.json) and exits.
 * Its entry points are found with dlsym (called directly when linked); everything is written with write(2)
 * from static buffers, in hex text, which no scan takes for a pointer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 5
#define BLOCKS 20000
#define LATE 40             /* blocks each parked thread frees after its walk (local free lists) */
#define CROSS 60            /* blocks of thread 0 the main thread frees (thread-free lists) */
#define HUGE 4320           /* the one huge block each thread keeps */

typedef struct {
    void *blocks;
    size_t reserved, committed, used, block_size, full_block_size;
} area_t;
typedef bool visit_fn(const void *, const area_t *, void *, size_t, void *);
typedef bool (*visit_blocks_fn)(const void *, bool, visit_fn *, void *);
typedef void *(*heap_fn)(void);
typedef void (*void_fn)(void);
typedef void (*collect_fn)(bool);
typedef int (*version_fn)(void);
typedef void output_fn(const char *, void *);
typedef void (*print_fn)(output_fn *, void *);
typedef void (*process_fn)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *);
typedef size_t (*usable_fn)(const void *);

#ifdef MI_LINKED
#ifdef MI_THEAP                         /* mimalloc 3.2 on: a heap per thread is a theap */
bool mi_theap_visit_blocks(const void *, bool, visit_fn *, void *);
void *mi_theap_get_default(void);
#define mi_heap_visit_blocks mi_theap_visit_blocks
#define mi_heap_get_default mi_theap_get_default
#define mi_stats_merge no_merge
#else
bool mi_heap_visit_blocks(const void *, bool, visit_fn *, void *);
void *mi_heap_get_default(void);
void mi_stats_merge(void);
#endif
void mi_collect(bool);
int mi_version(void);
void mi_stats_print_out(output_fn *, void *);
void mi_process_info(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *);
size_t mi_usable_size(const void *);
#define ENTRY(name) ((void *)&name)
#else
#define ENTRY(name) dlsym(RTLD_DEFAULT, #name)
#endif

/* from mimalloc 3.2 the statistics need no merging */
static void no_merge(void)
{
}

static int theaps;                       /* mimalloc 3.2 on: a heap per thread is a theap */

static visit_blocks_fn visit_blocks;
static heap_fn default_heap;
static void_fn stats_merge;
static usable_fn usable_size;

static const char *folder;
static char *kept[THREADS][BLOCKS];
static char *churned[1 << 16];
static char ledgers[THREADS + 1][1 << 20];
static size_t ledger_at[THREADS + 1];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t parked_cond = PTHREAD_COND_INITIALIZER;
static int parked;

static size_t size_of(unsigned i)
{
    static const size_t sizes[] = {8, 16, 24, 32, 48, 64, 96, 128, 200, 256, 400, 512, 1000, 1024, 2048, 4096,
                                   7000, 8192, 20000, 65536, 100000};
    if (i == HUGE)
        return (size_t)40 << 20;               /* huge: a segment of its own */
    return i % 97 == 0 ? (size_t)(300 + i % 5) << 10 : sizes[(i * 7919u) % (sizeof sizes / sizeof sizes[0])];
}

static void say(long t, const char *format, unsigned long a, unsigned long b)
{
    ledger_at[t] += (size_t)snprintf(ledgers[t] + ledger_at[t], sizeof ledgers[t] - ledger_at[t], format, a, b);
}

static bool visitor(const void *heap, const area_t *area, void *block, size_t size, void *arg)
{
    long t = (long)arg;
    (void)heap;
    if (block == NULL) {
        ledger_at[t] += (size_t)snprintf(ledgers[t] + ledger_at[t], sizeof ledgers[t] - ledger_at[t],
                                         "a %lx %zx %zx %zx %zx\n", (unsigned long)area->blocks, area->reserved,
                                         area->committed, area->used, area->block_size);
        return true;
    }
    say(t, "b %lx %zx\n", (unsigned long)block, size);
    return true;
}

/* Thread T's ledger (the main thread's: T == THREADS) into KIND-T.txt (KIND-main.txt): "ledger" as it walked
 * its heap, "snapshot" walked again at the snapshot. */
static void write_ledger(long t, const char *kind)
{
    char path[4096];
    if (t == THREADS)
        snprintf(path, sizeof path, "%s/%s-main.txt", folder, kind);
    else
        snprintf(path, sizeof path, "%s/%s-%ld.txt", folder, kind, t);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, ledgers[t], ledger_at[t]) != (ssize_t)ledger_at[t])
        abort();
    close(fd);
}

/* Zeroes the stack below the caller's frame, where the frames of the calls it made (malloc's, the walk's) left
 * copies of block addresses: an exiting thread's stack is kept for the next thread, and the scan reads it. */
static __attribute__((noinline)) void scrub_stack(void)
{
    volatile char below[1 << 18];
    explicit_bzero((void *)below, sizeof below);
}

/* Allocates the MiB the environment's NAME asks for (none when it is not set) in blocks of SIZE bytes, into
 * `churned` from its second entry on, touching them when TOUCH, then frees them all, in order.
 * MI_HOLD_CACHE: the exiting thread, in blocks of 32 KiB (first into the free spans of its segments), before its
 * walk: the segments they filled are freed whole (into mimalloc 2.0's segment cache), and no thread allocates
 * after it.  MI_HOLD_MAIN: the main thread first, in blocks of 1 KiB, keeping one block of 100 bytes (in
 * `churned[0]`): their pages are freed, their slices wait for the purge delay, but the last, which its heap keeps
 * (retired) for a while. */
static void churn(const char *name, size_t size, int touch)
{
    const char *mib = getenv(name);
    size_t n = mib == NULL ? 0 : ((size_t)atol(mib) << 20) / size + 1;
    if (n > sizeof churned / sizeof churned[0])
        n = sizeof churned / sizeof churned[0];
    for (size_t i = 1; i < n; i++) {
        churned[i] = malloc(size);
        if (touch)
            memset(churned[i], 0x21, size);
    }
    for (size_t i = 1; i < n; i++) {
        free(churned[i]);
        churned[i] = NULL;
    }
}

static void *worker(void *arg)
{
    long t = (long)arg;
    int exits = t == THREADS - 1;
    char **blocks = kept[t];
    for (unsigned i = 0; i < BLOCKS; i++) {
        size_t size = size_of(i);
        blocks[i] = malloc(size);
        if (blocks[i] == NULL)
            abort();
        /* all of it (but the huge block's tail): no stale word of an earlier use of its memory stays */
        memset(blocks[i], (int)i, size <= (512 << 10) ? size : 64);
    }
    for (unsigned i = 0; i < BLOCKS; i++) {
        unsigned j = (i * 7u) % BLOCKS;           /* scattered */
        if (j % 3) {
            free(blocks[j]);
            blocks[j] = NULL;                     /* no stale address: the scan would take it for a reference */
        }
    }
    if (exits)
        churn("MI_HOLD_CACHE", 32 << 10, 1);
    say(t, exits ? "exits %lx\n" : "parks %lx\n", (unsigned long)default_heap(), 0);
    visit_blocks(default_heap(), true, visitor, (void *)t);
    /* the huge block, which a walk of its heap misses where its segment belongs to no thread (up to 2.0.7) */
    say(t, "k %lx %zx\n", (unsigned long)blocks[HUGE], usable_size(blocks[HUGE]));
    if (!exits) {
        for (unsigned j = 3, n = 0; n < LATE; j += 3 * 37, n++) {
            say(t, "f %lx\n", (unsigned long)blocks[j % BLOCKS], 0);
            free(blocks[j % BLOCKS]);
            blocks[j % BLOCKS] = NULL;
        }
    }
    /* every block it keeps, wherever it is: mimalloc 3 gives up full pages of live threads too (abandoned, for
     * other threads to reclaim), which a walk of its heap does not see */
    for (unsigned i = 0; i < BLOCKS; i++)
        if (blocks[i] != NULL)
            say(t, "l %lx %zx\n", (unsigned long)blocks[i], usable_size(blocks[i]));
    write_ledger(t, "ledger");
    stats_merge();
    pthread_mutex_lock(&lock);
    parked++;
    pthread_cond_signal(&parked_cond);
    pthread_mutex_unlock(&lock);
    if (exits) {
        explicit_bzero(blocks, sizeof kept[t]);     /* its kept blocks are leaked: no copy of their address stays */
        scrub_stack();
        return NULL;
    }
    for (;;)
        pause();
}

static char out[1 << 20];
static size_t out_at;

static void append(const char *s)
{
    size_t n = strlen(s);
    if (out_at + n < sizeof out) {
        memcpy(out + out_at, s, n);
        out_at += n;
    }
}

/* S as the body of a JSON string (quotes, backslashes and control characters escaped). */
static void append_escaped(const char *s, void *arg)
{
    (void)arg;
    static char one[8];
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            snprintf(one, sizeof one, "\\%c", c);
        else if (c < 0x20)
            snprintf(one, sizeof one, "\\u%04x", c);
        else
            one[0] = (char)c, one[1] = 0;
        append(one);
    }
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

static int write_file(const char *name, const char *text, size_t n)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return 1;
    return write(fd, text, n) != (ssize_t)n || close(fd) != 0;
}

/* mimalloc's statistics and process figures, into stats.json. */
static int write_stats(version_fn version, print_fn print, process_fn process)
{
    static char line[1024];
    size_t v[8] = {0};
    process(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    snprintf(line, sizeof line, "{\"version\": %d, \"process\": {\"elapsed_msecs\": %zu, \"user_msecs\": %zu, "
             "\"system_msecs\": %zu, \"current_rss\": %zu, \"peak_rss\": %zu, \"current_commit\": %zu, "
             "\"peak_commit\": %zu, \"page_faults\": %zu}, \"stats\": \"", version(), v[0], v[1], v[2], v[3], v[4],
             v[5], v[6], v[7]);
    append(line);
    print(append_escaped, NULL);
    append("\"}\n");
    return write_file("stats.json", out, out_at);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    folder = argv[1];
    visit_blocks = (visit_blocks_fn)ENTRY(mi_heap_visit_blocks);
    default_heap = (heap_fn)ENTRY(mi_heap_get_default);
    stats_merge = (void_fn)ENTRY(mi_stats_merge);
#ifndef MI_LINKED
    if (dlsym(RTLD_DEFAULT, "mi_theap_get_default") != NULL) {   /* mimalloc 3.2 on: each thread's theap */
        default_heap = (heap_fn)dlsym(RTLD_DEFAULT, "mi_theap_get_default");
        visit_blocks = (visit_blocks_fn)dlsym(RTLD_DEFAULT, "mi_theap_visit_blocks");
        stats_merge = no_merge;
        theaps = 1;
    }
#else
#ifdef MI_THEAP
    theaps = 1;
#endif
#endif
    usable_size = (usable_fn)ENTRY(mi_usable_size);
    collect_fn collect = (collect_fn)ENTRY(mi_collect);
    version_fn version = (version_fn)ENTRY(mi_version);
    print_fn print = (print_fn)ENTRY(mi_stats_print_out);
    process_fn process = (process_fn)ENTRY(mi_process_info);
    if (!visit_blocks || !default_heap || !stats_merge || !usable_size || !collect || !version || !print ||
        !process)
        return 3;
    if (getenv("MI_HOLD_MAIN") != NULL)
        churned[0] = malloc(100);
    churn("MI_HOLD_MAIN", 1024, 0);
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS - 1; t++)
        if (pthread_create(&threads[t], NULL, worker, (void *)t) != 0)
            return 1;
    pthread_mutex_lock(&lock);
    while (parked < THREADS - 1)
        pthread_cond_wait(&parked_cond, &lock);
    pthread_mutex_unlock(&lock);
    /* the exiting thread last, alone: no other thread held the blocks it leaks, and none allocates after it
     * (which would reclaim its abandoned segments) */
    if (pthread_create(&threads[THREADS - 1], NULL, worker, (void *)(long)(THREADS - 1)) != 0 ||
        pthread_join(threads[THREADS - 1], NULL) != 0)
        return 1;

    say(THREADS, "main %lx\n", (unsigned long)default_heap(), 0);
    visit_blocks(default_heap(), true, visitor, (void *)(long)THREADS);
    for (unsigned j = 1, n = 0; n < CROSS; j += 3 * 53) {
        if (kept[0][j % BLOCKS] != NULL) {
            say(THREADS, "f %lx\n", (unsigned long)kept[0][j % BLOCKS], 0);
            free(kept[0][j % BLOCKS]);
            kept[0][j % BLOCKS] = NULL;
            n++;
        }
    }
    write_ledger(THREADS, "ledger");
    /* mimalloc 3.2 on: a thread that frees a block of a page another thread gave up takes the page (the main
     * thread's frees above may have): walk every parked thread's theap, and the main thread's, again now */
    if (theaps) {
        for (long t = 0; t <= THREADS; t++) {
            if (t == THREADS - 1)
                continue;
            /* its theap, from its ledger's first line (kept as text only: a word holding it would be taken
             * for mimalloc's cache of thread data when mimalloc is linked in) */
            void *heap = (void *)strtoul(strchr(ledgers[t], ' ') + 1, NULL, 16);
            ledger_at[t] = 0;
            say(t, "now %lx\n", (unsigned long)heap, 0);
            visit_blocks(heap, true, visitor, (void *)t);
            write_ledger(t, "snapshot");
        }
    }
    stats_merge();
    if (write_stats(version, print, process))
        return 1;
    kill(getpid(), SIGSTOP);

    static char line[512];
    size_t v[8];
    process(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    size_t commit_before = v[5];
    long before = rss_anon();
    collect(true);
    long after = rss_anon();
    process(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    size_t commit_after = v[5];
    int n = snprintf(line, sizeof line, "{\"rss_anon_before\": %ld, \"rss_anon_after\": %ld, \"commit_before\": %zu, "
                     "\"commit_after\": %zu}\n", before, after, commit_before, commit_after);
    return write_file("collect.json", line, (size_t)n);
}
