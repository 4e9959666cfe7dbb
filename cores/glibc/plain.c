/* plain: a few allocations and frees, then a stop; no ledger, so it also runs under other allocators
 * (LD_PRELOAD=libjemalloc.so.2) and, with HW_NO_MALLOC=1, as a process that never calls malloc. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static void *volatile keep[512];

int main(void)
{
    if (!getenv("HW_NO_MALLOC")) {
        for (int i = 0; i < 512; i++) {
            keep[i] = malloc(16 + (size_t)(i % 64) * 16);
            memset(keep[i], 1, 16);
        }
        for (int i = 0; i < 512; i += 2)
            free(keep[i]);
    }
    raise(SIGSTOP);
    return 0;
}
