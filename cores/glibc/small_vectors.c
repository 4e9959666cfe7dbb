/* small_vectors: a C++-style daemon full of small growing vectors.
 *
 * One thread, several phases.  Each phase builds many small "vectors" that
 * grow by reallocation (16 -> 32 -> 64 -> 112 bytes: every growth frees the old
 * buffer), then destroys most of them in an interleaved order and keeps every
 * fourth.  Survivors are scattered over the whole heap, the last one allocated
 * sits next to top, so top cannot shrink; fastbins and tcache are full.
 */
#include "hw.h"

#include <stdlib.h>

#define PHASES 4
#define VECTORS 100000

static void *grow(void *old, size_t size)
{
    void *p = hw_malloc(size);
    if (old)
        hw_free(old);
    return p;
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "small_vectors");
    static void *vec[VECTORS];
    static const size_t steps[] = { 16, 32, 64, 112 };
    long mallocs = 0, survivors = 0;
    unsigned seed = 12345;
    for (int phase = 0; phase < PHASES; phase++) {
        for (int i = 0; i < VECTORS; i++) {
            int growth = 1 + (int)(rand_r(&seed) % 4);
            void *v = NULL;
            for (int g = 0; g < growth; g++, mallocs++)
                v = grow(v, steps[g] + (size_t)phase * 8);
            vec[i] = v;
        }
        for (int i = 0; i < VECTORS; i++) {
            int j = (int)(((long)i * 7919) % VECTORS);
            if (j % 4 == phase % 4)
                survivors++;
            else
                hw_free(vec[j]);
        }
    }
    void *pin = hw_malloc(48);
    (void)pin;
    hw_note_fact("mallocs", mallocs + 1);
    hw_note_fact("survivors", survivors + 1);
    hw_ledger("main");
    hw_snapshot();
    return 0;
}
