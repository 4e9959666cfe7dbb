/* The library of je_both (cores/jemalloc/je_both.c).  Its program loads it with dlopen(RTLD_DEEPBIND), so its
 * own dependency, glibc, is searched first when its calls are bound: its malloc and free are glibc's,
 * while the program allocates with jemalloc (LD_PRELOAD).
 *
 * plugin_cache(slot) keeps a cache of records of mixed sizes and frees every third, which leaves
 * glibc's tcache, fastbins and bins holding chunks, and one mmapped chunk; called from two threads it
 * fills the main arena and a thread arena.  plugin_malloc_info(fd) writes glibc's malloc_info(3).
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECORDS 3000
#define SLOTS 2

static void *records[SLOTS][RECORDS];
static void *big[SLOTS];

int plugin_cache(unsigned slot) {
    if (slot >= SLOTS)
        return -1;
    for (unsigned i = 0; i < RECORDS; i++) {
        size_t n = 16 + (size_t)(((slot + 7) * 2654435761u + i * 40503u) % 1200);
        records[slot][i] = malloc(n);
        if (records[slot][i] == NULL)
            return -1;
        memset(records[slot][i], 0x3c, n);
    }
    for (unsigned i = 0; i < RECORDS; i += 3) {
        free(records[slot][i]);
        records[slot][i] = NULL;
    }
    big[slot] = malloc(300000);   /* above the mmap threshold glibc starts with */
    return big[slot] == NULL ? -1 : 0;
}

int plugin_malloc_info(int fd) {
    FILE *fp = fdopen(fd, "w");
    if (fp == NULL)
        return -1;
    int rc = malloc_info(0, fp);
    return fclose(fp) != 0 ? -1 : rc;
}
