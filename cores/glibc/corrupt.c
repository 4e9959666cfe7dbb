/* corrupt: damages its own heap in one way (HW_CORRUPT=<mode>), the way real bugs do, and stops before glibc
 * notices; or, for the abort_* modes, goes on until glibc aborts.
 *
 * Before stopping it writes expected.json into the directory given as argv[1]:
 *   {"mode": ..., "kind": <heapwalk's finding kind>, "address": <where the bad data lives>, "glibc": "2.NN"}
 * "address" is a chunk address (user pointer - 16) for chunks, a user pointer for tcache entries (glibc's tcache
 * links user pointers), or 0 when the program cannot know it (the arena of a held mutex).
 *
 * Each mode first checks that glibc put the chunks where the mode needs them (it reads its own freed chunks),
 * and exits with status 3 if not, so a changed glibc cannot make the expected address wrong.
 *
 * Modes (the bug each imitates):
 *   fd_bk             a write after free rewrites bk of a chunk in a small bin
 *   prev_size         a buffer underflow rewrites the prev_size of the chunk after a free one
 *   fastbin_size      a write after free rewrites the size of a fastbin chunk (not on 2.43+: no fastbins)
 *   tcache_misaligned a write after free rewrites a tcache next link to a misaligned pointer
 *   tcache_count      a write after free ends a tcache list early (count 3, 2 linked)
 *   double_free       a chunk freed into the unsorted bin is freed again into the tcache
 *   overlaps_top      tcache poisoning: a next link points into the top chunk
 *   list_cycle        a small bin's last chunk links back to its first (a cycle not through the head)
 *   unmapped          a tcache next link points to unmapped memory
 *   free_unlisted     an off-by-one NUL byte clears the next chunk's PREV_INUSE
 *   chunk_size        an overflow writes garbage over the next chunk's size (the heap walk must resynchronise)
 *   size_zero         a memset one word too long clears the next chunk's size (0 is no chunk mid-heap)
 *   size_into_next    an overflow enlarges a chunk's own size into the chunk after it (the finding names it)
 *   heap_page_zeroed  the main heap's first page is zeroed (its tcache struct and first chunks)
 *   arena_ring        a stray write over a thread arena's next: the arenas after it in the ring are found by
 *                     their heaps
 *   main_arena_next   the same over main_arena's next: every thread arena is found by its heap
 *   nextsize          a write after free rewrites fd_nextsize of a large bin chunk
 *   mutex             a thread blocks in malloc_stats() (stderr is a full pipe) holding main_arena's mutex
 *   tcache_to_stack   tcache poisoning: a write after free points a next link at the stack (the finding is at the
 *                     entry whose link was written, not at the stack)
 *   fastbin_to_stack  the same through a fastbin chunk's fd (not on 2.43+)
 *   top_shrunk        a write over the top chunk's size makes it end short of its heap's end
 *   tcache_in_free    a chunk freed into the unsorted bin, merged there with the free chunk before it, then freed
 *                     again into the tcache: a tcache entry inside a larger free chunk (how2heap's botcake)
 *   mmapped_grown     an overflow grows an mmapped chunk's size over the mmapped chunk right after it
 *   mp_tcache_bins    a stray write over mp_.tcache_bins (the number of tcache bins: writes past the tcache later)
 *   spirit_inside     a chunk forged inside an in-use chunk's data and freed (how2heap's house of spirit, in the
 *                     heap): a tcache entry inside a chunk in use
 *   foreign_sbrk      (clean) the program moves the break itself between mallocs, as glibc allows: no finding
 *   morecore_failure  (clean) a mapping right after the break stops sbrk: glibc goes on in mmap'd pieces (the
 *                     main arena becomes non-contiguous): no finding
 *   abort_double_free       free() of a chunk already in the unsorted bin: "double free or corruption (!prev)"
 *   abort_unaligned_tcache  malloc() meets a misaligned tcache link: "malloc(): unaligned tcache chunk detected"
 */
#define _GNU_SOURCE
#pragma GCC diagnostic ignored "-Wuse-after-free" /* the point of this program */
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static char out_buf[4096];
static FILE *out;
static const char *mode;
static int minor;
static int fill;

static void fail(const char *why)
{
    fprintf(stderr, "corrupt %s: setup failed: %s\n", mode, why);
    exit(3);
}

/* What glibc stores in a singly linked next field at POS (safe-linking from 2.32). */
static uintptr_t protect(void *pos, uintptr_t ptr)
{
    return minor >= 32 ? (((uintptr_t)pos >> 12) ^ ptr) : ptr;
}

static uintptr_t reveal(void *pos, uintptr_t stored) { return protect(pos, stored); }

/* Stores P where the compiler cannot see it unused (gcc drops a malloc whose result is never used). */
static void *volatile sink;
static void *keep(void *p)
{
    sink = p;
    return p;
}

static uintptr_t *words(void *p) { return (uintptr_t *)p; }

static uintptr_t chunk_of(void *user) { return (uintptr_t)user - 16; }

/* expected.json: the finding KIND at ADDRESS (0: not known here) whose bad value is FOUND (0: not checked). */
static void expect_found(const char *kind, uintptr_t address, uintptr_t found)
{
    fprintf(out, "{\"mode\": \"%s\", \"kind\": \"%s\", \"address\": %lu, \"found\": %lu, \"glibc\": \"2.%d\", "
            "\"pid\": %d}\n", mode, kind, (unsigned long)address, (unsigned long)found, minor, (int)getpid());
    if (fflush(out))
        fail("cannot write expected.json");
}

static void expect(const char *kind, uintptr_t address) { expect_found(kind, address, 0); }

static void *guarded(size_t n)
{
    void *p = keep(malloc(n));
    memset(p, 0x5a, n);
    memset(keep(malloc(24)), 0x47, 24);
    return p;
}

/* Fills the tcache bin of REQUEST bytes, so the next free of that size goes elsewhere. */
static void fill_tcache(size_t request)
{
    void *p[32];
    for (int i = 0; i < fill; i++)
        p[i] = guarded(request);
    for (int i = 0; i < fill; i++)
        free(p[i]);
}

/* Three chunks of 0x110 in small bin 17, in list order (head->fd first). */
static void small_bin_of_three(void *order[3])
{
    void *c[3];
    for (int i = 0; i < 3; i++)
        c[i] = guarded(0x100);
    fill_tcache(0x100); /* after c: its chunks must not come from the tcache */
    for (int i = 0; i < 3; i++)
        free(c[i]);
    keep(malloc(0x2000)); /* sorts the unsorted bin into the small bin */
    /* the last chunk's fd is the bin head (no other chunk); the first is the one no chunk's fd points to */
    int last = -1, first = -1;
    for (int i = 0; i < 3; i++) {
        int pointed = 0, points = 0;
        for (int j = 0; j < 3; j++) {
            if (words(c[j])[0] == chunk_of(c[i]))
                pointed = 1;
            if (words(c[i])[0] == chunk_of(c[j]))
                points = 1;
        }
        if (!points)
            last = i;
        if (!pointed)
            first = i;
    }
    if (last < 0 || first < 0 || last == first)
        fail("the small bin does not hold the three chunks");
    order[0] = c[first];
    order[2] = c[last];
    order[1] = c[3 - first - last];
    if (words(order[0])[0] != chunk_of(order[1]) || words(order[1])[0] != chunk_of(order[2]))
        fail("the small bin's order is not what was read");
}

/* A tcache bin of 0x50 chunks holding exactly three entries, head first. */
static void tcache_of_three(void *order[3])
{
    void *c[3];
    for (int i = 0; i < 3; i++)
        c[i] = guarded(0x48);
    for (int i = 0; i < 3; i++)
        free(c[i]);
    /* freed last = list head */
    order[0] = c[2];
    order[1] = c[1];
    order[2] = c[0];
    if (reveal(order[0], words(order[0])[0]) != (uintptr_t)order[1] ||
        reveal(order[1], words(order[1])[0]) != (uintptr_t)order[2] || reveal(order[2], words(order[2])[0]) != 0)
        fail("the tcache list is not the three chunks");
}

/* /proc/self/maps as it is now, in a buffer of its own (each call reads it again). */
static char *read_maps(void)
{
    static char maps[1 << 16];
    int fd = open("/proc/self/maps", O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, maps, sizeof maps - 1);
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        fail("cannot read /proc/self/maps");
    maps[n] = 0;
    return maps;
}

/* The start of the main arena's heap: the [heap] mapping, where glibc's first break was. */
static uintptr_t heap_start(void)
{
    char *maps = read_maps();
    for (char *line = maps; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        unsigned long lo, hi;
        char *end = strchr(line, '\n');
        if (end)
            *end = 0;
        if (strstr(line, "[heap]") && sscanf(line, "%lx-%lx", &lo, &hi) == 2)
            return lo;
        if (end)
            *end = '\n';
    }
    fail("no [heap] mapping");
    return 0;
}

/* mp_.tcache_bins in libc's data: the word 64 (TCACHE_MAX_BINS) followed by tcache_max_bytes (1032; 1041 in
 * 2.43) and the tcache count (7, 16 from 2.43), found once in libc's writable mapping. */
static uintptr_t *mp_tcache_bins(void)
{
    char *maps = read_maps();
    uintptr_t *found = NULL;
    for (char *line = strtok(maps, "\n"); line; line = strtok(NULL, "\n")) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[1] != 'w' || !strstr(line, "/libc"))
            continue;
        for (uintptr_t *w = (uintptr_t *)lo; w + 3 <= (uintptr_t *)hi; w++)
            if (w[0] == 64 && (w[1] == 1032 || w[1] == 1041) && w[2] == (uintptr_t)fill) {
                if (found)
                    fail("mp_.tcache_bins found twice");
                found = w;
            }
    }
    if (!found)
        fail("mp_.tcache_bins not found");
    return found;
}

/* Starts a detached thread with a small stack (keeps cores small). */
static void spawn(void *(*fn)(void *), void *arg)
{
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, fn, arg) != 0)
        fail("pthread_create");
}

static sem_t arena_ready;
static void *arena_chunks[4];

/* A worker that gets a thread arena of its own (its first malloc) and parks. */
static void *arena_worker(void *arg)
{
    arena_chunks[(intptr_t)arg] = keep(malloc(0x100));
    sem_post(&arena_ready);
    for (;;)
        pause();
    return NULL;
}

/* The arena of a thread-arena chunk: its heap (64 MiB-aligned) starts with heap_info, whose ar_ptr is first. */
static uintptr_t arena_of(void *chunk)
{
    return *(uintptr_t *)((uintptr_t)chunk & ~(uintptr_t)(64 * 1024 * 1024 - 1));
}

static sem_t holder_ready;
static pid_t holder_tid;

static void *hold_main_arena(void *arg)
{
    (void)arg;
    holder_tid = (pid_t)syscall(SYS_gettid);
    sem_post(&holder_ready);
    malloc_stats(); /* takes main_arena's mutex, then blocks writing to the full stderr pipe */
    return NULL;
}

/* Waits until thread TID sits in the write system call. */
static void wait_for_write(pid_t tid)
{
    char path[64], buf[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    for (int i = 0; i < 500; i++) {
        int fd = open(path, O_RDONLY);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
        if (fd >= 0)
            close(fd);
        if (n > 0 && buf[0] == '1' && buf[1] == ' ')
            return;
        usleep(10000);
    }
    fail("the malloc_stats thread never blocked in write");
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[4096];
    mode = getenv("HW_CORRUPT");
    if (!mode)
        fail("HW_CORRUPT is not set");
    if (sscanf(gnu_get_libc_version(), "2.%d", &minor) != 1)
        fail("cannot parse the glibc version");
    fill = minor >= 43 ? 16 : 7;
    snprintf(path, sizeof path, "%s/expected.json", dir);
    out = fopen(path, "w");
    if (!out)
        fail("cannot open expected.json");
    setvbuf(out, out_buf, _IOFBF, sizeof out_buf);

    /* some live memory first, so the damage sits among ordinary chunks */
    for (int i = 0; i < 20; i++)
        guarded(16 + 24 * (size_t)i);

    if (!strcmp(mode, "fd_bk")) {
        void *c[3];
        small_bin_of_three(c);
        words(c[1])[1] = 0x4141414141414140;
        expect("fd_bk_mismatch", chunk_of(c[1]));
    } else if (!strcmp(mode, "prev_size")) {
        void *a = keep(malloc(0x100));
        void *b = keep(malloc(0x80)); /* stays in use */
        keep(malloc(24));
        fill_tcache(0x100);
        free(a);                   /* into the unsorted bin: b's PREV_INUSE clear, prev_size 0x110 */
        words(b)[-2] = 0x12340;    /* b's prev_size */
        expect("prev_size_mismatch", chunk_of(b));
    } else if (!strcmp(mode, "fastbin_size")) {
        if (minor >= 43)
            fail("glibc 2.43 has no fastbins");
        void *x = guarded(0x28);
        fill_tcache(0x28);
        free(x);
        words(x)[-1] = 0x51;
        expect("fastbin_size", chunk_of(x));
    } else if (!strcmp(mode, "tcache_misaligned")) {
        void *t[3];
        tcache_of_three(t);
        words(t[0])[0] = protect(t[0], (uintptr_t)t[1] + 8);
        expect_found("misaligned", (uintptr_t)t[0], (uintptr_t)t[1] + 8);
    } else if (!strcmp(mode, "tcache_count")) {
        void *t[3];
        tcache_of_three(t);
        words(t[1])[0] = protect(t[1], 0);
        expect("tcache_count", (uintptr_t)t[1]);
    } else if (!strcmp(mode, "double_free")) {
        void *x = guarded(0x100);
        fill_tcache(0x100);
        free(x);         /* the tcache bin is full: the unsorted bin */
        keep(malloc(0x100)); /* one out of the tcache: room for one */
        free(x);         /* no key in x: glibc does not see the double free, x goes into the tcache too */
        expect("double_free", chunk_of(x));
    } else if (!strcmp(mode, "overlaps_top")) {
        void *t[3];
        tcache_of_three(t);
        void *probe = keep(malloc(0x18)); /* the last chunk carved from top: top starts right after it */
        uintptr_t in_top = ((uintptr_t)probe + 0x18 + 0x100 + 15) & ~(uintptr_t)15;
        words(t[0])[0] = protect(t[0], in_top);
        expect("overlaps_top", in_top - 16);
    } else if (!strcmp(mode, "list_cycle")) {
        void *c[3];
        small_bin_of_three(c);
        words(c[2])[0] = chunk_of(c[0]);
        expect("list_cycle", chunk_of(c[2]));
    } else if (!strcmp(mode, "unmapped")) {
        void *t[3];
        tcache_of_three(t);
        words(t[1])[0] = protect(t[1], 0x100000000000);
        expect("unmapped_pointer", (uintptr_t)t[1]);
    } else if (!strcmp(mode, "free_unlisted")) {
        void *a = keep(malloc(0xf8));
        void *b = keep(malloc(0xf8)); /* chunk 0x100: size field 0x101 */
        keep(malloc(24));
        if (words(b)[-1] != 0x101)
            fail("the chunk after a is not 0x101");
        memset(a, 0x61, 0xf8);
        ((unsigned char *)a)[0xf8] = 0; /* one byte too many: the low byte of b's size */
        expect("free_unlisted", chunk_of(a));
    } else if (!strcmp(mode, "chunk_size")) {
        void *a = keep(malloc(0x48));
        void *b = keep(malloc(0x48));
        for (int i = 0; i < 8; i++)
            guarded(0x30);
        memset(a, 0x41, 0x48 + 8); /* runs 8 bytes into b's header: its size */
        expect("chunk_size", chunk_of(b));
    } else if (!strcmp(mode, "size_zero")) {
        void *a = keep(malloc(0x48));
        void *b = keep(malloc(0x128));
        for (int i = 0; i < 8; i++)
            guarded(0x30);
        memset(a, 0, 0x48 + 8); /* a memset one word too long clears b's size */
        expect("chunk_size", chunk_of(b));
    } else if (!strcmp(mode, "size_into_next")) {
        void *a = keep(malloc(0x48));
        keep(malloc(0x128));
        for (int i = 0; i < 8; i++)
            guarded(0x30);
        words(a)[-1] += 0x20; /* a's size now runs 0x20 bytes into the chunk after it */
        expect("chunk_size", chunk_of(a));
    } else if (!strcmp(mode, "heap_page_zeroed")) {
        uintptr_t start = heap_start();
        for (int i = 0; i < 64; i++)
            guarded(0x100); /* chunks well past the first page */
        expect("chunk_size", start); /* first: the FILE it writes through is in that page */
        memset((void *)start, 0, 4096);
    } else if (!strcmp(mode, "arena_ring") || !strcmp(mode, "main_arena_next")) {
        sem_init(&arena_ready, 0, 0);
        for (intptr_t i = 0; i < 4; i++) { /* one at a time: each creates an arena, inserted after main_arena */
            spawn(arena_worker, (void *)i);
            sem_wait(&arena_ready);
        }
        uintptr_t arenas[4];
        for (int i = 0; i < 4; i++) {
            arenas[i] = arena_of(arena_chunks[i]);
            if (!(words(arena_chunks[i])[-1] & 4) || arena_of(arena_chunks[i]) == 0)
                fail("a worker did not get a thread arena");
        }
        /* the ring is main_arena, then the newest arena first: breaking the third worker's next loses the
         * first two workers' arenas from the ring */
        size_t off_next = minor >= 43 ? 2072 : 2160;
        uintptr_t holder = arenas[2];
        if (!strcmp(mode, "main_arena_next"))
            holder = *(uintptr_t *)(arenas[0] + off_next); /* the oldest arena's next is main_arena */
        uintptr_t *next = (uintptr_t *)(holder + off_next);
        if (*next != (holder == arenas[2] ? arenas[1] : arenas[3]))
            fail("the arena ring is not in creation order");
        *next = 0x4141414141414140; /* a stray write over arena.next */
        expect("arena_ring", holder);
    } else if (!strcmp(mode, "nextsize")) {
        void *p470 = guarded(0x468), *p440 = guarded(0x438);
        free(p470);
        free(p440);
        keep(malloc(0x2000));
        if (words(p470)[2] != chunk_of(p440) || words(p440)[2] != chunk_of(p470))
            fail("the large bin does not hold the two chunks as leaders");
        words(p470)[2] = 0x4242424242424240;
        expect("nextsize_mismatch", chunk_of(p470));
    } else if (!strcmp(mode, "mutex")) {
        int fds[2];
        if (pipe(fds) != 0)
            fail("pipe");
        fcntl(fds[1], F_SETFL, O_NONBLOCK);
        static char junk[4096];
        while (write(fds[1], junk, sizeof junk) > 0)
            ;
        fcntl(fds[1], F_SETFL, 0);
        dup2(fds[1], 2);
        sem_init(&holder_ready, 0, 0);
        spawn(hold_main_arena, NULL);
        sem_wait(&holder_ready);
        wait_for_write(holder_tid);
        expect("mutex_held", 0);
    } else if (!strcmp(mode, "tcache_to_stack")) {
        void *t[3];
        static volatile uintptr_t on_stack_holder;
        uintptr_t frame[4] __attribute__((aligned(16)));
        frame[0] = 0;
        on_stack_holder = (uintptr_t)frame;
        tcache_of_three(t);
        words(t[1])[0] = protect(t[1], (uintptr_t)frame);
        expect_found("link_outside_heap", (uintptr_t)t[1], (uintptr_t)frame);
        raise(SIGSTOP); /* here, so that FRAME is still this function's */
        return 0;
    } else if (!strcmp(mode, "fastbin_to_stack")) {
        if (minor >= 43)
            fail("glibc 2.43 has no fastbins");
        uintptr_t frame[4] __attribute__((aligned(16)));
        frame[1] = 0x31;
        void *x = guarded(0x28);
        fill_tcache(0x28);
        free(x);
        words(x)[0] = protect(x, (uintptr_t)frame);
        expect_found("link_outside_heap", chunk_of(x), (uintptr_t)frame);
        raise(SIGSTOP);
        return 0;
    } else if (!strcmp(mode, "top_shrunk")) {
        void *probe = keep(malloc(0x18)); /* the last chunk carved from top: top starts right after it */
        uintptr_t top = chunk_of(probe) + 0x20;
        if ((words((void *)(top + 16))[-1] & ~(uintptr_t)7) < 0x2000)
            fail("top is too small to shrink");
        words((void *)(top + 16))[-1] = 0x1001; /* a write over top's size: it ends 4 KiB on */
        expect("top_size", top);
    } else if (!strcmp(mode, "tcache_in_free")) {
        void *prev = keep(malloc(0x100));
        void *a = keep(malloc(0x100));
        guarded(24);
        fill_tcache(0x100);
        free(a);    /* the tcache bin is full: the unsorted bin */
        free(prev); /* merges with a: one free chunk of 0x220 at prev */
        if (words(prev)[-1] != 0x221)
            fail("prev and a did not merge");
        keep(malloc(0x100)); /* one out of the tcache: room for one */
        free(a);    /* no key in a: it goes into the tcache, 0x110 into the free chunk */
        expect("free_inside_chunk", (uintptr_t)a);
    } else if (!strcmp(mode, "mmapped_grown")) {
        /* the mapping is the size in pages (2.43 gives mmapped chunks a size 16 bytes short of it); the kernel
         * places a mapping below the last one unless a hole fits it: a pair that is not adjacent is kept and
         * another one taken */
        static void *pairs[16];       /* every pair taken stays referenced: none is a leak */
        void *hi = NULL, *lo = NULL;
        uintptr_t span_lo = 0, size_hi = 0;
        for (int tries = 0; tries < 8; tries++) {
            hi = pairs[2 * tries] = malloc(0x40000), lo = pairs[2 * tries + 1] = malloc(0x40000);
            span_lo = ((words(lo)[-1] & ~(uintptr_t)7) + 4095) & ~(uintptr_t)4095;
            size_hi = words(hi)[-1] & ~(uintptr_t)7;
            if ((words(lo)[-1] & 2) && chunk_of(lo) + span_lo == chunk_of(hi))
                break;
        }
        if (!(words(lo)[-1] & 2) || chunk_of(lo) + span_lo != chunk_of(hi))
            fail("the two mmapped chunks are not next to each other");
        words(lo)[-1] = (span_lo + size_hi) | 2; /* lo now runs over hi */
        expect("mmapped_overlap", chunk_of(lo));
    } else if (!strcmp(mode, "mp_tcache_bins")) {
        uintptr_t *field = mp_tcache_bins();
        *field = 0x7fffffffffff;
        expect("mp_field", (uintptr_t)field);
    } else if (!strcmp(mode, "spirit_inside")) {
        uintptr_t *outer = keep(malloc(0x98)); /* chunk 0xa0, in use */
        guarded(24);
        outer[1] = 0x31;                 /* a fake chunk of 0x30 at outer + 0: its size word at outer + 8 */
        outer[1 + 6] = 0x21;             /* and the next chunk's size after it, as free() looks at it */
        free(outer + 2);                 /* the fake's user memory: into the tcache of 0x30 */
        expect("free_inside_chunk", (uintptr_t)(outer + 2));
    } else if (!strcmp(mode, "foreign_sbrk")) {
        for (int i = 0; i < 64; i++)
            guarded(0x400);
        if (sbrk(3 * 4096) == (void *)-1) /* the program's own use of the break, right after malloc's */
            fail("sbrk");
        for (int i = 0; i < 256; i++)
            guarded(0x400); /* the main arena grows past it: glibc finds the break moved and goes on */
        expect("none", 0);
    } else if (!strcmp(mode, "morecore_failure")) {
        for (int i = 0; i < 64; i++)
            guarded(0x400);
        uintptr_t end = ((uintptr_t)sbrk(0) + 4095) & ~(uintptr_t)4095;
        if (mmap((void *)end, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
                 0) != (void *)end)
            fail("no mapping right after the break");
        void *last = NULL;
        for (int i = 0; i < 400; i++)
            last = guarded(0x1000); /* past the break: glibc's MORECORE fails, it maps pieces instead */
        if ((uintptr_t)last < end + (1 << 20) && (uintptr_t)last > end - (1 << 20))
            fail("the main arena did not go on in mapped memory");
        expect("none", 0);
    } else if (!strcmp(mode, "abort_double_free")) {
        void *x = guarded(0x500); /* above the tcache sizes: freed into the unsorted bin */
        expect("abort", chunk_of(x));
        free(x);
        free(x);
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_tcache_double_free")) {
        void *x = guarded(0x48);
        expect("abort", chunk_of(x));
        free(x);
        free(x); /* its key marks it as in this thread's tcache */
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_fasttop")) {
        if (minor >= 43)
            fail("glibc 2.43 has no fastbins");
        void *x = guarded(0x28);
        fill_tcache(0x28);
        expect("abort", chunk_of(x));
        free(x); /* the tcache bin is full: the fastbin, whose top it becomes */
        free(x);
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_out")) {
        void *x = guarded(0x500);
        uintptr_t end = (uintptr_t)sbrk(0); /* the main arena's top ends at the break */
        words(x)[-1] = ((end - chunk_of(x) + 0x10000) & ~(uintptr_t)15) | 1; /* an overflow rewrote its size */
        expect("abort", chunk_of(x));
        free(x);
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_invalid_pointer")) {
        void *x = guarded(0x48);
        words(x)[0] = 0;     /* what free() takes for a size there has no IS_MMAPPED bit */
        expect("abort", chunk_of(x));
        char *volatile inside = (char *)x + 8; /* a pointer into the middle of a block, kept as programs do */
        free(inside);
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_invalid_size")) {
        void *x = guarded(0x48);
        words(x)[-1] = 0x10 | 1; /* an underflow of the block before rewrote its size: under MINSIZE */
        expect("abort", chunk_of(x));
        free(x);
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_munmap")) {
        void *x = guarded(0x2000);
        words(x)[-1] |= 2; /* IS_MMAPPED set on a heap chunk */
        expect("abort", chunk_of(x));
        free(x);
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_top_size")) {
        void *probe = keep(malloc(0x18)); /* carved from top: top starts right after it */
        uintptr_t top = chunk_of(probe) + 0x20;
        words((void *)(top + 16))[-1] = 0x7ffffffffff1; /* an overflow rewrote top's size */
        expect("abort", top);
        keep(malloc(0x10000));
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_size_vs_prev_size")) {
        void *b = keep(malloc(0x500));
        void *a = keep(malloc(0x500));
        void *guard = keep(malloc(24));
        free(a);                    /* into the unsorted bin; guard's prev_size 0x510 */
        words(guard)[-2] = 0x1230;  /* an underflow of guard rewrote it */
        expect("abort", chunk_of(a));
        free(b);                    /* consolidates forward with a: unlink checks a's size */
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_unsorted")) {
        void *x = guarded(0x500);
        free(x);
        words(x)[0] = 0x4141414141414140; /* a write after free rewrote its fd */
        expect("abort", chunk_of(x));
        keep(malloc(0x600)); /* malloc takes it off the unsorted bin */
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_smallbin")) {
        void *c[3];
        small_bin_of_three(c);
        for (int i = 0; i < fill; i++)
            keep(malloc(0x100)); /* empties the tcache bin */
        words(c[2])[1] = chunk_of(c[0]); /* a write after free rewrote the last chunk's bk */
        expect("abort", chunk_of(c[2]));
        keep(malloc(0x100)); /* taken from the small bin's end */
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_free_unsorted")) {
        void *x = guarded(0x500);
        void *z = guarded(0x500);
        free(x);
        words(x)[1] = 0x4141414141414140; /* a write after free rewrote its bk */
        expect("abort", chunk_of(x));
        free(z); /* goes to the unsorted bin's front, after checking the chunk there */
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_consolidate")) {
        if (minor >= 43)
            fail("glibc 2.43 has no fastbins");
        void *x = guarded(0x28);
        fill_tcache(0x28);
        free(x);                 /* the fastbin of 0x30 */
        words(x)[-1] = 0x41;     /* a write after free rewrote its size */
        expect("abort", chunk_of(x));
        keep(malloc(0x500));     /* a large request consolidates the fastbins */
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_realloc_next_size")) {
        void *a = keep(malloc(0x48));
        void *b = keep(malloc(0x48));
        keep(malloc(24));
        words(b)[-1] = 0;        /* an overflow of a cleared b's size */
        expect("abort", chunk_of(a));
        keep(realloc(a, 0x100));
        fail("glibc did not abort");
    } else if (!strcmp(mode, "abort_unaligned_tcache")) {
        if (minor < 32)
            fail("no tcache alignment check before 2.32");
        void *t[3];
        tcache_of_three(t);
        words(t[0])[0] = protect(t[0], (uintptr_t)t[1] + 8);
        expect_found("misaligned", 0, (uintptr_t)t[1] + 8);
        keep(malloc(0x48)); /* t[0]; the bin's head becomes the misaligned pointer */
        keep(malloc(0x48)); /* glibc checks the head: abort */
        fail("glibc did not abort");
    } else {
        fail("unknown mode");
    }
    raise(SIGSTOP);
    return 0;
}
