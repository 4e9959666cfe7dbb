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
 * At the snapshot the workers are parked and the main thread takes the snapshot
 * (je_common.h).
 */
#include "je_common.h"

#define WORKERS 6
#define OBJECTS 20000

static pthread_barrier_t parked;
static void *first_blocks[WORKERS];

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
    return je_park(free_first ? "free_first" : "malloc_first", &parked);
}

int main(int argc, char **argv) {
    if (argc < 2)
        die("usage: je_dns OUTDIR");
    je_find();
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
    if (pthread_create(&threads[WORKERS], NULL, je_idle, &parked) != 0)
        die("pthread_create failed");
    pthread_barrier_wait(&parked);

    je_snapshot(stats_fd, ledger_fd);
    return 0;
}
