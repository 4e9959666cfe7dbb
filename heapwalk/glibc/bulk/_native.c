/* heapwalk's pointer-chasing loops in C, and the one pass's gathering of a window's chunks, loaded with ctypes
 * by heapwalk/glibc/bulk/native.py.
 *
 * All are plain loops over arrays numpy owns: no Python objects, no Python.h.  native.py and sweep.py hold the
 * same loops in Python and numpy, used when this library was not built; the tests hold the two equal.
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

/* The address, size field and the two words after it (fd and bk) of each of the NFOUND chunks whose size fields
 * are at word FOUND[k] of the N WORDS read from BASE (FOUND ascending, each at least 1, the last below N - 2),
 * into ADDRESS, FIELD, FD and BK.  Returns 0 when a chunk whose PREV_INUSE is clear does not have the size of
 * the chunk before it as its prev_size (BEFORE: the size of the chunk before the first, -1 when there is none),
 * else 1. */
int64_t hw_gather(const uint64_t *words, int64_t n, const int64_t *found, int64_t nfound, uint64_t base,
                  int64_t before, uint64_t *address, uint64_t *field, uint64_t *fd, uint64_t *bk)
{
    int64_t prev = before;
    (void)n;
    for (int64_t k = 0; k < nfound; k++) {
        int64_t j = found[k];
        uint64_t f = words[j];
        if (!(f & 1) && (prev < 0 || words[j - 1] != (uint64_t)prev))
            return 0;
        address[k] = base - 8 + 8 * (uint64_t)j;
        field[k] = f;
        fd[k] = words[j + 1];
        bk[k] = words[j + 2];
        prev = (int64_t)(f & ~(uint64_t)7);
    }
    return 1;
}

/* One free list of a swept arena, followed and judged at once.  The N chunks are at ADDRESS (sorted), with their
 * size fields FIELD and the words after them FD and BK; SUCCESSOR gives the index of the chunk each chunk's link
 * leads to (negative for none).  The list starts at the chunk FIRST and must end at a chunk whose link (its fd,
 * undone of safe-linking when SAFE) is END, within STEPS links and shorter than BOUND chunks.  Every chunk's size
 * (its field less the three flag bits) must lie in [LO, HI].  With MIRROR, each chunk's bk must lead back to the
 * chunk before it (the first's to END, the list's head) and HEAD_BK to the last.  No chunk may be coded other
 * than PLAIN in CODES already; each is then coded CODE.  Writes each chunk's index, address and field in list
 * order to ORDER, OUT_ADDRESS and OUT_FIELD (room for STEPS) and returns how many; -1 when the list fails any of
 * this (CODES may then hold some of its chunks coded).  The list is followed first, then its chunks are looked
 * at: the second loop's reads do not wait on each other. */
int64_t hw_list(const int64_t *successor, const uint64_t *address, const uint64_t *field, const uint64_t *fd,
                const uint64_t *bk, int64_t n, uint64_t first, uint64_t end, int64_t safe, int64_t steps,
                int64_t bound, uint64_t lo, uint64_t hi, int64_t mirror, uint64_t head_bk, uint8_t *codes,
                uint8_t plain, uint8_t code, int64_t *order, uint64_t *out_address, uint64_t *out_field)
{
    if (first == end)
        return mirror && head_bk != end ? -1 : 0;
    int64_t a = 0, b = n;                      /* the first chunk at or above FIRST */
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (address[m] < first)
            a = m + 1;
        else
            b = m;
    }
    if (a >= n || address[a] != first)
        return -1;
    int64_t count = hw_follow(successor, n, a, steps, order);
    if (count < 0)
        return -1;
    int64_t last = order[count - 1];
    uint64_t link = safe ? fd[last] ^ ((address[last] + 16) >> 12) : fd[last];
    if (link != end || count >= bound || (mirror && head_bk != address[last]))
        return -1;
    uint64_t before = end;
    for (int64_t k = 0; k < count; k++) {
        int64_t j = order[k];
        uint64_t size = field[j] & ~(uint64_t)7;
        if (size < lo || size > hi || codes[j] != plain || (mirror && bk[j] != before))
            return -1;
        codes[j] = code;
        out_address[k] = before = address[j];
        out_field[k] = field[j];
    }
    return count;
}
