/* A top chunk kept under a raised trim threshold, as php-fpm with ImageMagick keeps one (issue 41): a block
 * above the mmap threshold, freed from its own mapping, raises glibc's dynamic thresholds (the mmap threshold
 * to its size, the trim threshold to twice that); then 30,000 small blocks grow the main arena's top and are
 * all freed back into it (seven freed first fill their tcache bin, so that none stands between the others and
 * the top).  The top then stays: it is under the trim threshold.  Run with MALLOC_TRIM_THRESHOLD_ set, the
 * thresholds are pinned instead.  With HEAPWALK_HOLES set in its environment, it instead allocates twelve
 * 2 MiB blocks under the raised mmap threshold (from the arena, where they would have been mapped apart
 * before), each followed by a small block it keeps, and frees the big ones: 24 MiB free in chunks the top
 * cannot take back.  The process stops itself for the capture (SIGSTOP). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BIG (20 << 20)
#define SMALL 1000
#define COUNT 30000
#define HOLE (2 << 20)
#define HOLES 12

/* Twelve 2 MiB blocks from the arena, each pinned by the small block after it, freed: holes of 2 MiB. */
static int holes(void)
{
    static char *volatile hole[HOLES], *volatile pin[HOLES];
    for (int i = 0; i < HOLES; i++) {
        hole[i] = malloc(HOLE);
        pin[i] = malloc(64);
        if (hole[i] == NULL || pin[i] == NULL)
            return 1;
        memset(hole[i], 3, HOLE);
    }
    for (int i = 0; i < HOLES; i++)
        free(hole[i]);
    return 0;
}

int main(void)
{
    char *volatile big = malloc(BIG);
    if (big == NULL)
        return 1;
    memset(big, 1, BIG);
    free(big);
    if (getenv("HEAPWALK_HOLES") != NULL) {
        if (holes() != 0)
            return 1;
        kill(getpid(), SIGSTOP);
        for (;;)
            pause();
    }
    static char *volatile small[COUNT], *volatile pad[7];
    for (int i = 0; i < 7; i++)
        pad[i] = malloc(SMALL);
    for (int i = 0; i < COUNT; i++) {
        small[i] = malloc(SMALL);
        if (small[i] == NULL)
            return 1;
        memset(small[i], 2, SMALL);
    }
    for (int i = 0; i < 7; i++)
        free(pad[i]);
    for (int i = COUNT - 1; i >= 0; i--)
        free(small[i]);
    kill(getpid(), SIGSTOP);
    for (;;)
        pause();
}
