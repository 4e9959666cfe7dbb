/* jemalloc reproducer: a service that holds what it allocated.  Run with LD_PRELOAD=libjemalloc.so.2, or
 * linked with a jemalloc (JE_LINKED).
 *
 * Four workers each allocate OBJECTS blocks of mixed sizes (mostly small, some of a few pages, a few
 * large up to 512 KiB), then free about 60% of them in an order of their own, so the slabs are left part
 * full, and keep the rest.  The main thread keeps a few blocks too, in an arena it makes for them
 * (arenas.create), then goes back to arena 0 to start the workers: arena 0 is where the C library's own
 * allocations go when jemalloc replaces malloc (the threads' TLS vectors, ...), which no ledger of this
 * program's can list.  Each thread notes what it holds,
 * by the usable size jemalloc itself gives each request (nallocx) and the arena it allocates from, and the
 * main thread writes it into held.json:
 *   {"held": [[arena, usable size, blocks], ...]}
 * That is the ledger a build without statistics is checked against.  A fifth thread never calls jemalloc.  Then the main thread takes the
 * snapshot (je_common.h) and the process stops.
 */
#include "je_common.h"

#define WORKERS 4
#define OBJECTS 8000
#define CLASSES 256

typedef size_t (*nallocx_fn)(size_t, int);
#ifdef JE_LINKED
size_t JE_NAME(nallocx)(size_t, int);
#endif

struct held {
    long arena;
    size_t usize;
    long count;
};

static nallocx_fn repro_nallocx;
static pthread_barrier_t parked;
static struct held totals[CLASSES * (WORKERS + 2)];
static int ntotals;
static pthread_mutex_t totals_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned next(unsigned *state) {
    *state = *state * 1103515245u + 12345u;
    return *state >> 8;
}

/* A request size: 80% 8-512 bytes, 15% up to 8 KiB, 4.7% up to 32 KiB, 0.3% 64-512 KiB. */
static size_t request(unsigned *state) {
    unsigned pick = next(state) % 1000;
    if (pick < 800)
        return 8 + next(state) % 505;
    if (pick < 950)
        return 513 + next(state) % (8192 - 512);
    if (pick < 997)
        return 8193 + next(state) % (32768 - 8192);
    return 65536 + next(state) % (458752);
}

static void note_held(long arena, size_t usize) {
    for (int i = 0; i < ntotals; i++)
        if (totals[i].arena == arena && totals[i].usize == usize) {
            totals[i].count++;
            return;
        }
    if (ntotals == (int)(sizeof totals / sizeof totals[0]))
        die("too many size classes held");
    totals[ntotals++] = (struct held){arena, usize, 1};
}

/* Allocates N blocks, frees those the seed picks (about 60%), notes the rest as held. */
static void hold(unsigned seed, int n, void **blocks) {
    unsigned state = seed;
    size_t *sizes = malloc(sizeof(size_t) * (size_t)n);
    if (sizes == NULL)
        die("malloc failed");
    for (int i = 0; i < n; i++) {
        sizes[i] = request(&state);
        blocks[i] = malloc(sizes[i]);
        if (blocks[i] == NULL)
            die("malloc failed");
        memset(blocks[i], 0x33, sizes[i] < 64 ? sizes[i] : 64);
    }
    for (int k = 0; k < n; k++) {             /* a walk over the blocks in an order of their own */
        int i = (int)((unsigned)k * 7919u % (unsigned)n);
        if (next(&state) % 10 < 6) {
            free(blocks[i]);
            blocks[i] = NULL;
        }
    }
    long arena = (long)thread_arena();
    pthread_mutex_lock(&totals_lock);
    for (int i = 0; i < n; i++)
        if (blocks[i] != NULL)
            note_held(arena, repro_nallocx(sizes[i], 0));
    pthread_mutex_unlock(&totals_lock);
    free(sizes);
}

static void *worker(void *arg) {
    static void *blocks[WORKERS][OBJECTS];
    long id = (long)arg;
    hold((unsigned)(id + 1) * 2654435761u, OBJECTS, blocks[id]);
    return je_park("worker", &parked);
}

static void write_held(int fd) {
    static char text[CLASSES * (WORKERS + 2) * 48 + 64];
    size_t len = (size_t)snprintf(text, sizeof text, "{\"held\": [");
    for (int i = 0; i < ntotals; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%s[%ld, %zu, %ld]", i ? ",\n  " : "",
                                totals[i].arena, totals[i].usize, totals[i].count);
    len += (size_t)snprintf(text + len, sizeof text - len, "]}\n");
    write_stats((void *)(long)fd, text);
    close(fd);
}

int main(int argc, char **argv) {
    static void *mine[400];
    if (argc < 2)
        die("usage: je_hold OUTDIR");
    je_find();
    repro_nallocx = (nallocx_fn)JE_LOOKUP(nallocx);
    if (repro_nallocx == NULL)
        die("nallocx not found");
    int stats_fd = open_out(argv[1], "stats.json"), ledger_fd = open_out(argv[1], "ledger.json");
    int held_fd = open_out(argv[1], "held.json");
    unsigned own = 0, first = 0;
    size_t len = sizeof own;
    if (repro_mallctl("arenas.create", &own, &len, NULL, 0) != 0 ||
        repro_mallctl("thread.arena", NULL, NULL, &own, sizeof own) != 0)
        die("cannot give the main thread an arena of its own");
    hold(7u, 400, mine);
    /* its cache would otherwise serve the C library's allocations with regions of its own arena */
    if (repro_mallctl("thread.tcache.flush", NULL, NULL, NULL, 0) != 0 ||
        repro_mallctl("thread.arena", NULL, NULL, &first, sizeof first) != 0)
        die("cannot take the main thread back to arena 0");
    pthread_barrier_init(&parked, NULL, WORKERS + 2);
    pthread_t threads[WORKERS + 1];
    for (long i = 0; i < WORKERS; i++)
        if (pthread_create(&threads[i], NULL, worker, (void *)i) != 0)
            die("pthread_create failed");
    if (pthread_create(&threads[WORKERS], NULL, je_idle, &parked) != 0)
        die("pthread_create failed");
    pthread_barrier_wait(&parked);
    write_held(held_fd);
    je_snapshot(stats_fd, ledger_fd);
    return 0;
}
