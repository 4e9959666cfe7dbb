/* heapwalk's walk of a free list through the slots of one page or span (heapwalk/inferior/slots.py): slot i is
 * [start + i*size, start + (i+1)*size), and each free slot links the next by its first word.  Loaded with ctypes;
 * no Python headers.  The Python form in slots.py gives the same answers (tests/unit/inferior/test_slots.py). */
#define _FILE_OFFSET_BITS 64
#include <stdint.h>
#include <string.h>
#include <unistd.h>

enum { ENDED = 0, OUTSIDE = 1, TWICE = 2, CUT = 3 };

/* Version of the arguments below: slots.py refuses a library built from other sources. */
int64_t hw_slots_abi(void) { return 3; }

/* Follows the list from HEAD through DATA (LEN bytes of the slots, from START): marks each slot it reaches in
 * SEEN with MARK (a byte a slot, shared by the lists of one page; a slot marked already is met TWICE) and writes
 * its index to OUT (room for COUNT; NULL: not written).  Returns
 * how many it reached; *STOP says why it stopped (ENDED at a null link; OUTSIDE: a link that is no slot, or
 * TWICE: a slot already seen, both at *AT; CUT: the slot at *AT has no word in DATA). */
static int64_t walk(const uint8_t *data, uint64_t len, uint64_t start, uint64_t size, uint64_t count,
                   uint64_t head, uint8_t *seen, uint8_t mark, uint32_t *out, int32_t *stop, uint64_t *at)
{
    uint64_t link = head;
    int64_t n = 0;
    while (link) {
        uint64_t off = link - start, i = off / size;
        if (link < start || i >= count || off % size) {
            *stop = OUTSIDE;
            *at = link;
            return n;
        }
        if (seen[i]) {
            *stop = TWICE;
            *at = link;
            return n;
        }
        seen[i] = mark;
        if (out)
            out[n] = (uint32_t)i;
        n++;
        if (off + 8 > len) {
            *stop = CUT;
            *at = link;
            return n;
        }
        memcpy(&link, data + off, 8);
    }
    *stop = ENDED;
    *at = 0;
    return n;
}

/* `walk` marking each slot 1. */
int64_t hw_slot_list(const uint8_t *data, uint64_t len, uint64_t start, uint64_t size, uint64_t count,
                     uint64_t head, uint8_t *seen, uint32_t *out, int32_t *stop, uint64_t *at)
{
    return walk(data, len, start, size, count, head, seen, 1, out, stop, at);
}

/* The lists of N pages or spans whose bytes lie in DATA (LEN bytes from BASE): page K's COUNTS[K] slots of SIZES[K]
 * bytes from STARTS[K], its list from HEADS[K] (0: none), its marks at SEEN + OFFSETS[K].  FOUND[K], STOPS[K] and
 * ATS[K] say what `walk` said of it, each slot reached marked MARK; a page that DATA does not hold whole is CUT at
 * its start, not walked. */
void hw_slot_lists(const uint8_t *data, uint64_t len, uint64_t base, int64_t n, const uint64_t *starts,
                   const int64_t *sizes, const int64_t *counts, const uint64_t *heads, const int64_t *offsets,
                   uint8_t *seen, uint8_t mark, int64_t *found, int32_t *stops, uint64_t *ats)
{
    for (int64_t k = 0; k < n; k++) {
        uint64_t at = starts[k] - base, bytes = (uint64_t)counts[k] * (uint64_t)sizes[k];
        if (starts[k] < base || at > len || bytes > len - at) {
            found[k] = 0;
            stops[k] = CUT;
            ats[k] = starts[k];
            continue;
        }
        found[k] = walk(data + at, bytes, starts[k], (uint64_t)sizes[k], (uint64_t)counts[k], heads[k],
                        seen + offsets[k], mark, 0, stops + k, ats + k);
    }
}

/* A list whose nodes link the next by their first word, read from a core file (heapwalk/inferior/coreread.py): the
 * file FD stores the words of [LO[i], HI[i]) at offset OFF[i] (NSEG segments, sorted, apart).  Writes HEAD, then
 * each link read, to OUT: at most COUNT links, stopping after a null link, at a node whose word the file does not
 * hold, or once a node comes again (Brent's way: within twice the steps to the loop and around it).  Returns how
 * many values it wrote (at least 1: HEAD). */
int64_t hw_core_links(int64_t fd, const uint64_t *lo, const uint64_t *hi, const uint64_t *off, int64_t nseg,
                      uint64_t head, int64_t count, uint64_t *out)
{
    int64_t n = 0, power = 1, steps = 0;
    uint64_t link = head, mark = head;
    out[n++] = head;
    while (link && n <= count) {
        int64_t a = 0, b = nseg;                /* the last segment starting at or below the link */
        while (b - a > 1) {
            int64_t m = (a + b) / 2;
            if (lo[m] <= link)
                a = m;
            else
                b = m;
        }
        if (nseg == 0 || link < lo[a] || link >= hi[a] || hi[a] - link < 8)
            break;
        uint64_t word;
        if (pread((int)fd, &word, 8, (off_t)(off[a] + (link - lo[a]))) != 8)
            break;
        link = word;
        out[n++] = link;
        if (link == mark)
            break;
        if (++steps == power) {
            mark = link;
            power *= 2;
            steps = 0;
        }
    }
    return n;
}
