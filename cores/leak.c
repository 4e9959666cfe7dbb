/* leak: memory that is in use, not free.
 *
 * Allocates about 24 MiB in 30000 buffers of 100 to 1500 bytes, writes them
 * all and frees none, as a program that leaks (or simply keeps a large
 * working set) would.  There are no free chunks: a report must call this
 * memory in use and must not blame fragmentation.
 */
#include "hw.h"

#include <stdlib.h>

int main(int argc, char **argv)
{
    hw_init(argc, argv, "leak");
    unsigned seed = 12345;
    for (int i = 0; i < 30000; i++) {
        seed = seed * 1103515245u + 12345u;
        hw_malloc(100 + (seed >> 16) % 1400);
    }
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
