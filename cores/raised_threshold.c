/* A top chunk kept under a raised trim threshold, as php-fpm with ImageMagick keeps one (issue 41): a block
 * above the mmap threshold, freed from its own mapping, raises glibc's dynamic thresholds (the mmap threshold
 * to its size, the trim threshold to twice that); then 30,000 small blocks grow the main arena's top and are
 * all freed back into it (seven freed first fill their tcache bin, so that none stands between the others and
 * the top).  The top then stays: it is under the trim threshold.  Run with MALLOC_TRIM_THRESHOLD_ set, the
 * thresholds are pinned instead.  The process stops itself for the capture (SIGSTOP). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BIG (20 << 20)
#define SMALL 1000
#define COUNT 30000

int main(void)
{
    char *volatile big = malloc(BIG);
    if (big == NULL)
        return 1;
    memset(big, 1, BIG);
    free(big);
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
