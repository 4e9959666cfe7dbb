/* heapwalk's two pointer-chasing loops in C, loaded with ctypes by heapwalk/glibc/native.py.
 *
 * Both are plain loops over arrays numpy owns: no Python objects, no Python.h.  native.py holds the same
 * loops in Python, used when this library was not built; the tests hold the two equal.
 */

#include <stdint.h>

/* Steps through a window of heap words from the size field at word J, by each chunk's size in words, while
 * the field is within the N words and looks like a chunk's (at least MIN_SIZE, a multiple of 16).  Writes
 * each field's index to OUT, which has room for N / 4 + 1 (a chunk is at least four words); stores how many
 * in *COUNT and returns the index it stopped at. */
int64_t hw_chase(const uint64_t *words, int64_t n, int64_t j, uint64_t min_size, int64_t *out, int64_t *count)
{
    int64_t k = 0;
    while (j >= 0 && j < n) {
        uint64_t field = words[j];
        if ((field & 8) || field < min_size)
            break;
        out[k++] = j;
        j += (int64_t)(field >> 3);
    }
    *count = k;
    return j;
}

/* Follows a list through SUCCESSOR (the index of the chunk each chunk's link leads to, negative for none)
 * from chunk J, writing each chunk's index to OUT, for at most STEPS links.  Returns how many chunks, or -1
 * when the list goes on past STEPS links (too long, or a loop). */
int64_t hw_follow(const int64_t *successor, int64_t n, int64_t j, int64_t steps, int64_t *out)
{
    int64_t k = 0;
    for (;;) {
        out[k++] = j;
        if (j < 0 || j >= n)
            return -1;
        j = successor[j];
        if (j < 0)
            return k;
        if (--steps <= 0)
            return -1;
    }
}
