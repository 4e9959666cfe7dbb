/* heapwalk's pointer-chasing loops in C, and the one pass's gathering of a window's chunks, loaded with ctypes
 * by heapwalk/glibc/bulk/native.py.
 *
 * All are plain loops over arrays numpy owns: no Python objects, no Python.h.  native.py and sweep.py hold the
 * same loops in Python and numpy, used when this library was not built; the tests hold the two equal.
 */

#include <stdint.h>


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

/* The sweep of a window: steps through the N WORDS read from BASE from the size field at word J, while the
 * field is below word LIMIT and a chunk's (at least MIN_SIZE, a multiple of 16), writing each chunk's address,
 * size field, fd and bk to ADDRESS, FIELD, FD and BK (room for LIMIT / 4 + 1 each) and their count to *COUNT.
 * Returns the word it stopped at, or -1 where the heap is not as glibc leaves it (a chunk whose PREV_INUSE is
 * clear without the size of the chunk before it, BEFORE for the first, as prev_size) or a chunk's fd and bk lie
 * past the words.  The words ahead are fetched while a chunk is judged: each step waits on the one before. */
int64_t hw_sweep_window(const uint64_t *words, int64_t n, int64_t limit, int64_t j, uint64_t min_size,
                        uint64_t base, int64_t before, uint64_t *address, uint64_t *field, uint64_t *fd,
                        uint64_t *bk, int64_t *count)
{
    int64_t k = 0, prev = before;
    *count = 0;
    while (j >= 0 && j < limit) {
        __builtin_prefetch(words + j + 32);
        uint64_t f = words[j];
        if ((f & 8) || f < min_size)
            break;
        if (j + 2 >= n || (!(f & 1) && (prev < 0 || words[j - 1] != (uint64_t)prev)))
            return -1;
        address[k] = base - 8 + 8 * (uint64_t)j;
        field[k] = f;
        fd[k] = words[j + 1];
        bk[k++] = words[j + 2];
        prev = (int64_t)(f & ~(uint64_t)7);
        j += (int64_t)(f >> 3);
    }
    *count = k;
    return j;
}

/* The runs of free chunks malloc_trim's consolidation would merge among the chunks [LO, HI) of CODES (each chunk's
 * listing code) and SIZES: each stretch of chunks whose codes lie in [RUN_LO, RUN_HI), its first chunk's index to
 * STARTS and the index past its last to ENDS, its bytes to BYTES, and whether a chunk of code FAST lies in it (1
 * or 0) to HAS_FAST (room for (HI - LO + 1) / 2 each).  Returns how many runs. */
int64_t hw_free_runs(const uint8_t *codes, const int64_t *sizes, int64_t lo, int64_t hi, int64_t run_lo,
                     int64_t run_hi, int64_t fast, int64_t *starts, int64_t *ends, int64_t *bytes,
                     uint8_t *has_fast)
{
    int64_t k = 0;
    for (int64_t i = lo; i < hi; i++) {
        if (codes[i] < run_lo || codes[i] >= run_hi)
            continue;
        int64_t total = 0;
        uint8_t any = 0;
        starts[k] = i;
        for (; i < hi && codes[i] >= run_lo && codes[i] < run_hi; i++) {
            total += sizes[i];
            any |= codes[i] == fast;
        }
        ends[k] = i;
        bytes[k] = total;
        has_fast[k++] = any;
    }
    return k;
}

/* Whether chunk J of the N whose size fields are FIELD is free: the chunk after it has PREV_INUSE clear. */
static int64_t is_free(const uint64_t *field, int64_t n, int64_t j)
{
    return j + 1 < n && !(field[j + 1] & 1);
}

/* The index of the first of the N chunks at ADDRESS (sorted) at or above each step of 1 << SHIFT bytes of NSPANS
 * spans [LO[s], HI[s]) into DIR (room for SLOTS[s] entries for span s, one after another): the directory
 * `chunk_at` looks chunks up with. */
void hw_chunk_dir(const uint64_t *address, int64_t n, const uint64_t *lo, const int64_t *slots, int64_t nspans,
                  int64_t shift, int64_t *dir)
{
    int64_t j = 0;
    for (int64_t s = 0; s < nspans; s++) {
        for (int64_t p = 0; p < slots[s]; p++) {
            uint64_t at = lo[s] + ((uint64_t)p << shift);
            while (j < n && address[j] < at)
                j++;
            *dir++ = j;
        }
    }
}

/* Chunks looked up ahead of the one being answered (`hw_successors`): their directory entries, then the chunks
 * those lead to, are fetched from memory meanwhile; RING holds what was found of each, from 2 * AHEAD ahead on */
#define AHEAD 16
#define RING 64

/* The chunk directory of a swept arena (`hw_chunk_dir`): its spans' bounds, slots and first entries. */
struct chunk_dir {
    const uint64_t *address;
    int64_t n;
    const uint64_t *lo, *hi;
    const int64_t *first, *dir;
    int64_t nspans, shift;
};

/* The directory entry where the search for a chunk at X starts, -1 when X lies in no span. */
static int64_t entry_of(const struct chunk_dir *d, uint64_t x)
{
    int64_t a = 0, b = d->nspans;              /* the span holding X: the last whose LO is at or below X */
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (d->lo[m] <= x)
            a = m + 1;
        else
            b = m;
    }
    if (a == 0 || x >= d->hi[a - 1])
        return -1;
    return d->first[a - 1] + (int64_t)((x - d->lo[a - 1]) >> d->shift);
}

/* The index of the chunk that starts at X, searched from chunk J on (a directory entry's), -1 when none does. */
static int64_t chunk_from(const struct chunk_dir *d, int64_t j, uint64_t x)
{
    while (j < d->n && d->address[j] < x)
        j++;
    return j < d->n && d->address[j] == x ? j : -1;
}

/* The index of the chunk that starts at X, -1 when no chunk does. */
static int64_t chunk_at(const struct chunk_dir *d, uint64_t x)
{
    int64_t e = entry_of(d, x);
    return e < 0 ? -1 : chunk_from(d, d->dir[e], x);
}

/* One free list of a swept arena, followed and judged at once.  The N chunks are at ADDRESS (sorted), with their
 * size fields FIELD and the words after them FD and BK, looked up through the directory LO, HI, SLOTS' FIRST
 * entries, DIR, NSPANS and SHIFT (`hw_chunk_dir`).  A chunk is free when the chunk after it in the arrays has
 * PREV_INUSE clear; a list of WANT 1 holds free chunks only, of WANT 0 chunks in use only, of WANT -1 any.  The
 * list starts at the chunk FIRST and must end at a chunk whose link (its fd, undone of safe-linking when SAFE) is
 * END, every link before that leading to a chunk's start, within STEPS links and shorter than BOUND chunks.  Every
 * chunk's size (its field less the three flag bits) must lie in [LO_SIZE, HI_SIZE].  With MIRROR, each chunk's bk
 * must lead back to the chunk before it (the first's to END, the list's head) and HEAD_BK to the last.  No chunk
 * may be coded other than PLAIN in CODES already; each is then coded CODE (a loop meets a chunk coded).  Writes
 * each chunk's address and field in list order to OUT_ADDRESS and OUT_FIELD (room for STEPS) and returns how
 * many; -1 when the list fails any of this (CODES may then hold some of its chunks coded). */
int64_t hw_walk_list(const uint64_t *address, const uint64_t *field, const uint64_t *fd, const uint64_t *bk,
                     int64_t n, const uint64_t *lo, const uint64_t *hi, const int64_t *first_slot, const int64_t *dir,
                     int64_t nspans, int64_t shift, int64_t want, uint64_t first, uint64_t end, int64_t safe,
                     int64_t steps, int64_t bound, uint64_t lo_size, uint64_t hi_size, int64_t mirror,
                     uint64_t head_bk, uint8_t *codes, uint8_t plain, uint8_t code, uint64_t *out_address,
                     uint64_t *out_field)
{
    struct chunk_dir d = {address, n, lo, hi, first_slot, dir, nspans, shift};
    if (first == end)
        return mirror && head_bk != end ? -1 : 0;
    uint64_t link = first, before = end;
    int64_t count = 0;
    while (link != end) {
        if (count >= steps || count + 1 >= bound)
            return -1;
        int64_t j = chunk_at(&d, link);
        if (j < 0)
            return -1;
        if (want >= 0 && is_free(field, n, j) != want)
            return -1;
        uint64_t size = field[j] & ~(uint64_t)7;
        if (size < lo_size || size > hi_size || codes[j] != plain || (mirror && bk[j] != before))
            return -1;
        codes[j] = code;
        out_address[count] = before = address[j];
        out_field[count++] = field[j];
        link = safe ? fd[j] ^ ((address[j] + 16) >> 12) : fd[j];
    }
    return mirror && head_bk != before ? -1 : count;
}

/* For each of the N chunks (N below 2 ** 31) a list of WANT may hold (1: free, 0: in use, -1: any), the index of
 * the chunk its link (its fd, undone of safe-linking when SAFE) leads to when that is one too, into OUT; -1 for
 * every other chunk and link.  The chunks as `hw_walk_list` takes them.  The lookups do not wait on each other, as
 * a list's hops would, and each is fetched ahead: `hw_list` then follows OUT. */
void hw_successors(const uint64_t *address, const uint64_t *field, const uint64_t *fd, int64_t n,
                   const uint64_t *lo, const uint64_t *hi, const int64_t *first_slot, const int64_t *dir,
                   int64_t nspans, int64_t shift, int64_t want, int64_t safe, int32_t *out)
{
    struct chunk_dir d = {address, n, lo, hi, first_slot, dir, nspans, shift};
    int64_t ring[RING];                        /* each chunk's directory entry (-1: none), then its search's start */
    for (int64_t j = -2 * AHEAD; j < n; j++) {
        int64_t a = j + 2 * AHEAD, b = j + AHEAD;
        if (a < n) {                           /* the entry fetched ahead ... */
            int64_t e = -1;
            if (want < 0 || is_free(field, n, a) == want)
                e = entry_of(&d, safe ? fd[a] ^ ((address[a] + 16) >> 12) : fd[a]);
            if (e >= 0)
                __builtin_prefetch(&dir[e]);
            ring[a % RING] = e;
        }
        if (b >= 0 && b < n && ring[b % RING] >= 0) {   /* ... then the chunks it leads to ... */
            int64_t from = dir[ring[b % RING]];
            __builtin_prefetch(&address[from]);
            __builtin_prefetch(&field[from + 1]);
            ring[b % RING] = from;
        } else if (b >= 0 && b < n) {
            ring[b % RING] = -1;
        }
        if (j < 0)
            continue;
        out[j] = -1;                           /* ... before this one's search */
        if (ring[j % RING] < 0)
            continue;
        int64_t k = chunk_from(&d, ring[j % RING], safe ? fd[j] ^ ((address[j] + 16) >> 12) : fd[j]);
        if (k >= 0 && (want < 0 || is_free(field, n, k) == want))
            out[j] = (int32_t)k;
    }
}

/* hw_successors' OUT for the N chunks made compact: the M chunks a list of WANT may hold (as hw_successors judges
 * them) written in order to INDEX (their indices among the N), and each one's successor to SUCCESSOR as its place
 * in INDEX (-1: none), so that a list's hops go through an array of those chunks only (a list's hops wait on
 * memory one after another, less in a smaller array).  OUT is used up (each such chunk's place in INDEX written
 * over its successor).  Returns M. */
int64_t hw_compact_links(int32_t *out, int64_t n, const uint64_t *field, int64_t want, int32_t *index,
                         int32_t *successor)
{
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++) {
        if (want >= 0 && is_free(field, n, j) != want)
            continue;
        index[m] = (int32_t)j;
        successor[m] = out[j];
        out[j] = (int32_t)m++;
    }
    for (int64_t r = 0; r < m; r++) {
        if (r + AHEAD < m && successor[r + AHEAD] >= 0)
            __builtin_prefetch(&out[successor[r + AHEAD]]);
        if (successor[r] >= 0)
            successor[r] = out[successor[r]];
    }
    return m;
}

/* Lists followed a lane at a time (`hw_rulers`, `follow_ruled`): each lane's next hop is fetched while the other
 * lanes' are made, so that the waits on memory of LANES lists overlap where one list's hops wait one after another */
#define LANES 16

/* The rulers of the M places of SUCCESSOR (`hw_linked_list`): every K-th place (0, K, 2K, ...), and for each the
 * ruler its list comes to next, as its number (place / K) in NEXT (-1: the list ends first; -2: it never ends) and
 * the places from it up to that one (itself included) in LENGTH (room for (M + K - 1) / K each).  The rulers' lists
 * are followed LANES at a time.  Returns 0, or -1 where the lists meet (a place two lists lead to: damage) so often
 * that following them would take more than twice M hops: then none is to be used. */
int64_t hw_rulers(const int32_t *successor, int64_t m, int64_t k, int32_t *next, int32_t *length)
{
    int64_t nr = (m + k - 1) / k, issued = 0, hops = 0;
    int64_t ruler[LANES], at[LANES], len[LANES];
    for (int g = 0; g < LANES; g++)
        ruler[g] = -1;
    for (;;) {
        int busy = 0;
        for (int g = 0; g < LANES; g++) {
            if (ruler[g] < 0) {
                if (issued >= nr)
                    continue;
                ruler[g] = issued++;
                at[g] = ruler[g] * k;
                len[g] = 0;
            }
            busy = 1;
            if (++hops > 2 * m + nr)
                return -1;
            len[g]++;
            int64_t q = successor[at[g]];
            if (q < 0 || q >= m || q % k == 0 || len[g] > m) {
                next[ruler[g]] = (int32_t)(len[g] > m ? -2 : q < 0 || q >= m ? -1 : q / k);
                length[ruler[g]] = (int32_t)len[g];
                ruler[g] = -1;
            } else {
                at[g] = q;
                __builtin_prefetch(&successor[q]);
            }
        }
        if (!busy)
            return 0;
    }
}

/* The list from place R through SUCCESSOR (M places) into ORDER, as the plain loop of `hw_linked_list` follows it,
 * through the rulers NEXT and LENGTH of every K-th place (`hw_rulers`): from R to the first ruler a hop at a time,
 * then from ruler to ruler, each stretch's place in ORDER known from the lengths before it (SEGMENTS: room for 2 *
 * ((M + K - 1) / K + 1)), then the stretches followed LANES at a time.  Returns how many places, or -1 when the list
 * goes on past STEPS places (or never ends). */
static int64_t follow_ruled(const int32_t *successor, int64_t m, int64_t r, int64_t steps, const int32_t *next,
                            const int32_t *length, int64_t k, int64_t *segments, int64_t *order)
{
    int64_t count = 0, nr = (m + k - 1) / k, ns = 0;
    while (r % k != 0) {                       /* to the first ruler */
        order[count++] = r;
        r = successor[r];
        if (r < 0 || r >= m)
            return r < 0 ? count : -1;
        if (count >= steps)
            return -1;
    }
    int64_t total = count;
    for (;;) {                                 /* ruler to ruler: each stretch's start and place in ORDER */
        int64_t x = r / k;
        if (ns > nr || next[x] == -2)
            return -1;                         /* a ruler met again, or a stretch that never ends: a loop */
        segments[2 * ns] = r;
        segments[2 * ns + 1] = total;
        ns++;
        total += length[x];
        if (next[x] == -1)
            break;
        if (total >= steps)
            return -1;
        r = (int64_t)next[x] * k;
    }
    if (total > steps)
        return -1;
    int64_t seg[LANES], at[LANES], left[LANES], to[LANES], issued = 0;
    for (int g = 0; g < LANES; g++)
        seg[g] = -1;
    for (;;) {                                 /* the stretches, LANES at a time */
        int busy = 0;
        for (int g = 0; g < LANES; g++) {
            if (seg[g] < 0) {
                if (issued >= ns)
                    continue;
                seg[g] = issued++;
                at[g] = segments[2 * seg[g]];
                to[g] = segments[2 * seg[g] + 1];
                left[g] = length[at[g] / k];
            }
            busy = 1;
            order[to[g]++] = at[g];
            if (--left[g] == 0) {
                seg[g] = -1;
            } else {
                at[g] = successor[at[g]];
                __builtin_prefetch(&successor[at[g]]);
            }
        }
        if (!busy)
            return total;
    }
}

/* One free list of a swept arena, followed and judged at once.  The N chunks are at ADDRESS (sorted), with their
 * size fields FIELD and the words after them FD and BK; the M chunks a list of WANT may hold are INDEX's (their
 * indices, ascending) and SUCCESSOR gives the place in INDEX of the chunk each one's link leads to (negative for
 * none: `hw_compact_links`; 4 bytes, and only those chunks, so that the hops, each a wait on memory, wait less).
 * The list starts at the chunk FIRST and must end at a chunk whose link (its fd, undone of safe-linking when SAFE)
 * is END, within STEPS links and shorter than BOUND chunks.  Every chunk's size (its field less the three flag
 * bits) must lie in [LO, HI].  With MIRROR, each chunk's bk must lead back to the chunk before it (the first's to
 * END, the list's head) and HEAD_BK to the last.  No chunk may be coded other than PLAIN in CODES already; each is
 * then coded CODE.  Writes each chunk's index, address and field in list order to ORDER, OUT_ADDRESS and
 * OUT_FIELD (room for STEPS) and returns how many; -1 when the list fails any of this (CODES may then hold some of
 * its chunks coded).  The list is followed first, then its chunks are looked at: the second loop's reads do not
 * wait on each other, and are fetched ahead.  With K (not 0), the list is followed through the rulers NEXT and
 * LENGTH of every K-th place (`hw_rulers`, `follow_ruled`; SEGMENTS their room), the same places in the same
 * order.  The first chunk must be one of INDEX's. */
int64_t hw_linked_list(const int32_t *successor, const int32_t *index, int64_t m, const uint64_t *address,
                       const uint64_t *field, const uint64_t *fd, const uint64_t *bk, int64_t n, uint64_t first,
                       uint64_t end, int64_t safe, int64_t steps, int64_t bound, uint64_t lo, uint64_t hi,
                       int64_t mirror, uint64_t head_bk, uint8_t *codes, uint8_t plain, uint8_t code, int64_t *order,
                       uint64_t *out_address, uint64_t *out_field, const int32_t *next, const int32_t *length,
                       int64_t k, int64_t *segments)
{
    if (first == end)
        return mirror && head_bk != end ? -1 : 0;
    int64_t r = 0, e = m;                      /* the first of INDEX's chunks at or above FIRST */
    while (r < e) {
        int64_t mid = r + (e - r) / 2;
        if (address[index[mid]] < first)
            r = mid + 1;
        else
            e = mid;
    }
    if (r >= m || address[index[r]] != first)
        return -1;
    int64_t count = 0;
    if (k > 0) {
        count = follow_ruled(successor, m, r, steps, next, length, k, segments, order);
        if (count < 0)
            return -1;
    } else {
        for (;;) {
            order[count++] = r;
            r = successor[r];
            if (r < 0)
                break;
            if (count >= steps)
                return -1;
        }
    }
    for (int64_t i = 0; i < count; i++) {      /* places in INDEX to chunks' indices */
        if (i + AHEAD < count)
            __builtin_prefetch(&index[order[i + AHEAD]]);
        order[i] = index[order[i]];
    }
    int64_t last = order[count - 1];
    uint64_t link = safe ? fd[last] ^ ((address[last] + 16) >> 12) : fd[last];
    if (link != end || count >= bound || (mirror && head_bk != address[last]))
        return -1;
    uint64_t before = end;
    for (int64_t i = 0; i < count; i++) {
        if (i + AHEAD < count) {              /* the chunk looked at ahead, fetched meanwhile */
            int64_t ahead = order[i + AHEAD];
            __builtin_prefetch(&address[ahead]);
            __builtin_prefetch(&field[ahead]);
            __builtin_prefetch(&bk[ahead]);
            __builtin_prefetch(&codes[ahead]);
        }
        int64_t j = order[i];
        uint64_t size = field[j] & ~(uint64_t)7;
        if (size < lo || size > hi || codes[j] != plain || (mirror && bk[j] != before))
            return -1;
        codes[j] = code;
        out_address[i] = before = address[j];
        out_field[i] = field[j];
    }
    return count;
}
