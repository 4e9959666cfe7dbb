/* jemalloc reproducer: blocks still reached and blocks leaked in each way, with a ledger of which is which
 * (leaks.json), for heapwalk's leak scan over jemalloc's regions.  Run with LD_PRELOAD=libjemalloc.so.2, or
 * linked with a jemalloc (JE_LINKED).
 *
 * Three workers each, in their own arena: keep 2,000 blocks of mixed sizes in a static array (reached), one
 * through a chain of three blocks (reached), one 100 bytes into it (reached by an interior pointer), one from
 * its thread's TLS (reached); and leak 300 single blocks (dropped, each unreferenced), a chain of three (its
 * head unreferenced, holding all three), a ring of three (no head: each held by another), a large block of
 * 96 KiB and one of 700 KiB, a block whose only pointer lies in a freed block, and a block that points to a
 * reached one.
 *
 * Every block's size is its usable size (nallocx).  The ledger is written with write(2) from static buffers;
 * the builders are separate functions whose frames are gone by the snapshot, and the dead stack below is
 * scrubbed, so that no stray copy of a leaked pointer survives where a scan would see it:
 *   {"reached": [ADDRESS, ...], "leaked": [[ADDRESS, UNREFERENCED, HOLDS_COUNT, HOLDS_BYTES], ...]}
 * Then the main thread takes jemalloc's snapshot (je_common.h) and the process stops.
 */
#include "je_common.h"

#include <stdint.h>

#define NOINLINE __attribute__((noinline))
#define WORKERS 3
#define KEPT 2000
#define SINGLES 300
#define MAX_LEAKED (WORKERS * (SINGLES + 16))

typedef size_t (*nallocx_fn)(size_t, int);
#ifdef JE_LINKED
size_t JE_NAME(nallocx)(size_t, int);
#endif

static nallocx_fn repro_nallocx;
static pthread_barrier_t parked;
static void *volatile kept[WORKERS][KEPT];          /* reached: a static array */
static void *volatile chain_head[WORKERS];          /* reached: the head of a chain of three */
static void *volatile interior[WORKERS];            /* reached: 100 bytes into a block */
static __thread void *volatile in_tls;              /* reached: the thread's TLS */

static uintptr_t reached[WORKERS * (KEPT + 8)];
static int nreached;
static struct { uintptr_t address; long unreferenced, count, bytes; } leaked[MAX_LEAKED];
static int nleaked;
static pthread_mutex_t notes = PTHREAD_MUTEX_INITIALIZER;

NOINLINE static void scrub(void *p, size_t n) {
    memset(p, 0, n);
    __asm__ volatile("" : : "r"(p) : "memory");
}

NOINLINE static void scrub_stack(void) {
    char pad[64 << 10];
    scrub(pad, sizeof pad);
}

static size_t usable(size_t n) {
    return repro_nallocx(n, 0);
}

NOINLINE static void *block(size_t n) {
    void *p = malloc(n);
    if (p == NULL)
        die("malloc failed");
    memset(p, 0, n < 256 ? n : 256);
    return p;
}

NOINLINE static void note_reached(void *p) {
    pthread_mutex_lock(&notes);
    reached[nreached++] = (uintptr_t)p;
    pthread_mutex_unlock(&notes);
}

NOINLINE static void note_leaked(void *p, long unreferenced, long count, long bytes) {
    pthread_mutex_lock(&notes);
    if (nleaked == MAX_LEAKED)
        die("too many leaked blocks");
    leaked[nleaked].address = (uintptr_t)p;
    leaked[nleaked].unreferenced = unreferenced;
    leaked[nleaked].count = count;
    leaked[nleaked].bytes = bytes;
    nleaked++;
    pthread_mutex_unlock(&notes);
}

static size_t size_of(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    unsigned pick = (*seed >> 8) % 100;
    *seed = *seed * 1103515245u + 12345u;
    if (pick < 85)
        return 16 + (*seed >> 8) % 900;
    if (pick < 98)
        return 1024 + (*seed >> 8) % 12000;
    return 20000 + (*seed >> 8) % 60000;
}

NOINLINE static void build_reached(long id) {
    unsigned seed = 1000u + (unsigned)id;
    for (int i = 0; i < KEPT; i++) {
        void *p = block(size_of(&seed));
        kept[id][i] = p;
        note_reached(p);
    }
    void **c = block(64), **b = block(64), *a = block(200);
    c[0] = b;
    b[0] = a;
    chain_head[id] = c;
    note_reached(c);
    note_reached(b);
    note_reached(a);
    char *inner = block(500);
    interior[id] = inner + 100;
    note_reached(inner);
    void *t = block(48);
    in_tls = t;
    note_reached(t);
}

NOINLINE static void build_leaked(long id) {
    unsigned seed = 5000u + (unsigned)id;
    for (int i = 0; i < SINGLES; i++) {
        size_t n = size_of(&seed);
        void *p = block(n);
        note_leaked(p, 1, 1, (long)usable(n));
    }
    void **c = block(64), **b = block(96), *a = block(128);      /* a chain: c -> b -> a */
    c[0] = b;
    b[0] = a;
    note_leaked(c, 1, 3, (long)(usable(64) + usable(96) + usable(128)));
    note_leaked(b, 0, 0, 0);
    note_leaked(a, 0, 0, 0);
    void **r1 = block(80), **r2 = block(80), **r3 = block(80);    /* a ring: r1 -> r2 -> r3 -> r1 */
    r1[0] = r2;
    r2[0] = r3;
    r3[0] = r1;
    note_leaked(r1, 0, 0, 0);
    note_leaked(r2, 0, 0, 0);
    note_leaked(r3, 0, 0, 0);
    void *big = block(96 << 10), *huge = block(700 << 10);
    note_leaked(big, 1, 1, (long)usable(96 << 10));
    note_leaked(huge, 1, 1, (long)usable(700 << 10));
    void *hidden = block(300);                                   /* its only pointer in a freed block */
    void **holder = block(64);
    holder[0] = hidden;
    free(holder);
    note_leaked(hidden, 1, 1, (long)usable(300));
    void **pointing = block(72);                                 /* leaked, points to a reached block */
    pointing[0] = (void *)kept[id][0];
    note_leaked(pointing, 1, 1, (long)usable(72));
    c = b = NULL;
    r1 = r2 = r3 = NULL;
    a = big = huge = hidden = NULL;
    holder = pointing = NULL;
}

static void *worker(void *arg) {
    long id = (long)arg;
    je_own_arena();
    build_reached(id);
    build_leaked(id);
    scrub_stack();
    note_thread("worker", thread_arena());
    scrub_stack();
    pthread_barrier_wait(&parked);
    pause();
    return NULL;
}

static char text[(WORKERS * (KEPT + 8) + MAX_LEAKED) * 64];

static void write_leaks(int fd) {
    size_t n = (size_t)snprintf(text, sizeof text, "{\"reached\": [");
    for (int i = 0; i < nreached; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%lu", i ? ", " : "", (unsigned long)reached[i]);
    n += (size_t)snprintf(text + n, sizeof text - n, "],\n \"leaked\": [");
    for (int i = 0; i < nleaked; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s[%lu, %ld, %ld, %ld]", i ? ",\n  " : "",
                              (unsigned long)leaked[i].address, leaked[i].unreferenced, leaked[i].count,
                              leaked[i].bytes);
    n += (size_t)snprintf(text + n, sizeof text - n, "]}\n");
    write_stats((void *)(long)fd, text);
    close(fd);
    scrub(text, sizeof text);
    scrub(leaked, sizeof leaked);          /* the ledger's own copies of the leaked addresses */
    scrub(reached, sizeof reached);
}

int main(int argc, char **argv) {
    if (argc < 2)
        die("usage: je_leak OUTDIR");
    je_find();
    repro_nallocx = (nallocx_fn)JE_LOOKUP(nallocx);
    if (repro_nallocx == NULL)
        die("nallocx not found");
    int stats_fd = open_out(argv[1], "stats.json"), ledger_fd = open_out(argv[1], "ledger.json");
    int leaks_fd = open_out(argv[1], "leaks.json");
    pthread_barrier_init(&parked, NULL, WORKERS + 1);
    pthread_t threads[WORKERS];
    for (long i = 0; i < WORKERS; i++)
        if (pthread_create(&threads[i], NULL, worker, (void *)i) != 0)
            die("pthread_create failed");
    pthread_barrier_wait(&parked);
    write_leaks(leaks_fd);
    scrub_stack();
    je_snapshot(stats_fd, ledger_fd);
    return 0;
}
