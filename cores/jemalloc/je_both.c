/* jemalloc reproducer: a process with both allocators.  Run with LD_PRELOAD=libjemalloc.so.2.
 *
 * The program allocates with jemalloc.  A library it loads with dlopen(RTLD_DEEPBIND), as PHP loads its
 * extensions (cores/jemalloc/je_both_plugin.c, built beside the program as libje_both_plugin.so), binds its
 * malloc and free to glibc's: the process has live memory in both allocators.
 *
 * The main thread and one worker each allocate objects of mixed small sizes from jemalloc and free every
 * other one, and a 4 MiB buffer they free (dirty pages); and each has the library build its cache, in
 * glibc's main arena and in a thread arena.  At the snapshot the worker is parked; the library writes
 * glibc's malloc_info(3) into malloc_info.xml, then the main thread takes jemalloc's snapshot
 * (je_common.h).
 */
#include "je_common.h"

#include <libgen.h>

#define OBJECTS 8000

typedef int (*cache_fn)(unsigned);
typedef int (*info_fn)(int);

static cache_fn plugin_cache;
static info_fn plugin_malloc_info;
static pthread_barrier_t parked;
static void *objects[2][OBJECTS];

/* The library beside this program, loaded with RTLD_DEEPBIND. */
static void load_plugin(void) {
    static char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
    if (n <= 0)
        die("readlink /proc/self/exe failed");
    path[n] = '\0';
    strcat(dirname(path), "/libje_both_plugin.so");
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == NULL)
        die(dlerror());
    plugin_cache = (cache_fn)dlsym(handle, "plugin_cache");
    plugin_malloc_info = (info_fn)dlsym(handle, "plugin_malloc_info");
    if (plugin_cache == NULL || plugin_malloc_info == NULL)
        die("libje_both_plugin.so lacks its functions");
}

/* The program's own objects (jemalloc), half of them freed, a buffer freed; then the library's cache (glibc). */
static void work(unsigned slot) {
    for (unsigned i = 0; i < OBJECTS; i++) {
        size_t n = 8 + (size_t)(((slot + 3) * 2654435761u + i * 40503u) % 500);
        objects[slot][i] = malloc(n);
        if (objects[slot][i] == NULL)
            die("malloc failed");
        memset(objects[slot][i], 0x5a, n);
    }
    for (unsigned i = 0; i < OBJECTS; i += 2)
        free(objects[slot][i]);
    void *buffer = malloc(4 << 20);
    if (buffer == NULL)
        die("malloc failed");
    memset(buffer, 1, 4 << 20);
    free(buffer);
    if (plugin_cache(slot) != 0)
        die("the library's cache failed");
}

static void *worker(void *arg) {
    (void)arg;
    work(1);
    return je_park("worker", &parked);
}

int main(int argc, char **argv) {
    if (argc < 2)
        die("usage: je_both OUTDIR");
    je_find();
    load_plugin();
    int stats_fd = open_out(argv[1], "stats.json"), ledger_fd = open_out(argv[1], "ledger.json");
    int info_fd = open_out(argv[1], "malloc_info.xml");
    work(0);
    pthread_barrier_init(&parked, NULL, 2);
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0)
        die("pthread_create failed");
    pthread_barrier_wait(&parked);
    if (plugin_malloc_info(info_fd) != 0)
        die("malloc_info failed");
    je_snapshot(stats_fd, ledger_fd);
    return 0;
}
