/* leak: memory that is in use, not free, and leaked.
 *
 * Allocates about 24 MiB in 30000 buffers of 100 to 1500 bytes, writes them
 * all, frees none and keeps no pointer to any of them, as a program that
 * leaks does.  There are no free chunks: a report must call this memory in
 * use, must not blame fragmentation, and its leak scan must find every one of
 * the 30000 buffers leaked.  The ledger's facts "leaked_count" and
 * "leaked_bytes" (chunk sizes: malloc_usable_size + 8) say what was dropped.
 *
 * The buffers come from plain malloc (hw_malloc would hold them), in a
 * separate function whose frame is scrubbed before the snapshot, so that no
 * stray copy of a pointer stays where a scan would see it.
 */
#include "hw.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))

static NOINLINE void leak_all(long long *count, long long *bytes)
{
    unsigned seed = 12345;
    for (int i = 0; i < 30000; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t n = 100 + (seed >> 16) % 1400;
        void *p = malloc(n);
        if (!p)
            abort();
        memset(p, 0xA5, n);
        *count += 1;
        *bytes += (long long)malloc_usable_size(p) + 8;
    }
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "leak");
    long long count = 0, bytes = 0;
    leak_all(&count, &bytes);
    hw_scrub_stack();
    hw_note_fact("leaked_count", count);
    hw_note_fact("leaked_bytes", bytes);
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
