/* Support for heapwalk's reproducer programs: see hw.h. */
#define _GNU_SOURCE
#include "hw.h"

#include <errno.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define TC_CLASSES 64   /* tcache small bins: chunk sizes 0x20 .. 0x410 */
#define TC_CAP 64       /* most entries a proven tcache bin may hold */
#define MAX_FACTS 64
#define MAX_MMAPPED 256
#define FREED_SLOTS (1u << 21)  /* open-addressing set of freed tcache-range chunks */
#define LIVE_SLOTS (1u << 21)   /* and of the chunks hw_malloc gave out and the program holds */
#define KEY_PROBE_REQUEST 1000  /* a size class the programs never use */
#define PATTERN 0xA5

struct thread_rec {
    int used;
    pid_t tid;
    char label[32];
    uintptr_t key;           /* glibc's tcache key as seen by this thread; before 2.29, which has no key,
                              * the address of the thread's tcache_perthread_struct */
    uintptr_t held;          /* a chunk the thread allocated and still holds */
    uintptr_t kept[8];       /* the key probe's guards and failed tries: held, so that hw leaks nothing */
    int nkept;
    int non_main_arena;      /* NON_MAIN_ARENA bit of that chunk's header */
    int in_ledger;
    int exited;
    int count[TC_CLASSES];   /* proven tcache: entries[c][0] is the list head */
    uintptr_t entries[TC_CLASSES][TC_CAP];
};

static char mi_buf[1 << 20], ledger_buf[1 << 20];
static FILE *mi_file, *ledger_file;
static const char *repro_name;
static int glibc_major, glibc_minor, fill_count;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct thread_rec threads[HW_MAX_THREADS];
static __thread struct thread_rec *self;
static struct { char key[48]; long long value; } facts[MAX_FACTS];
static int nfacts;
static struct { uintptr_t mem; size_t request; } mmapped[MAX_MMAPPED];
static int nmmapped;
static int trim_fd = -1;
static struct { uintptr_t mem, size; int mmapped; } large_tcache[MAX_MMAPPED];
static int nlarge;
static uintptr_t freed[FREED_SLOTS];
static unsigned char freed_owner[FREED_SLOTS], freed_class[FREED_SLOTS];
static sem_t arrivals;

static void die(const char *what)
{
    fprintf(stderr, "%s: %s\n", repro_name ? repro_name : "reproducer", what);
    abort();
}

static size_t chunk_size_for(size_t n)
{
    size_t sz = (n + sizeof(size_t) + 15) & ~(size_t)15;
    return sz < 32 ? 32 : sz;
}

static int tcache_class(size_t n)
{
    size_t sz = chunk_size_for(n);
    return sz <= 0x410 ? (int)((sz - 32) / 16) : -1;
}

static size_t class_request(int c) { return (size_t)c * 16 + 24; }

int hw_tcache_fill(void) { return fill_count; }

/* N bytes of this process's memory at ADDR into OUT; 0 when they are not all readable.  Read by the kernel,
 * never faulting (under qemu-user, which has no process_vm_readv, through a pipe: write() refuses unreadable
 * memory). */
static int peek(uintptr_t addr, void *out, size_t n)
{
    static __thread int through[2] = { -1, -1 };     /* a pipe a thread: two threads' bytes never mix */
    struct iovec local = { out, n }, remote = { (void *)addr, n };
    ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (got >= 0 || errno != ENOSYS)
        return got == (ssize_t)n;
    if (through[0] < 0) {          /* made on the stack: qemu with larger pages than its host's faults a TLS one */
        int fds[2];
        if (pipe(fds) != 0)
            return 0;
        through[0] = fds[0], through[1] = fds[1];
    }
    for (size_t done = 0; done < n;) {
        size_t step = n - done < 4096 ? n - done : 4096;
        if (write(through[1], (char *)addr + done, step) != (ssize_t)step ||
            read(through[0], (char *)out + done, step) != (ssize_t)step)
            return 0;
        done += step;
    }
    return 1;
}

static int peek_word(uintptr_t addr, uintptr_t *out) { return peek(addr, out, sizeof *out); }

/* ---- sets of chunk addresses (open addressing, no allocation) ---------- */

struct ptr_set {
    uintptr_t *keys;
    size_t mask, count;
    const char *name;
    void (*moved)(size_t to, size_t from);   /* satellite data follows its key */
};

static size_t set_slot(const struct ptr_set *s, uintptr_t p)
{
    return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> 32) & s->mask;
}

/* Adds P (if not there) and returns its slot. */
static size_t set_add(struct ptr_set *s, uintptr_t p)
{
    size_t i = set_slot(s, p);
    while (s->keys[i] && s->keys[i] != p)
        i = (i + 1) & s->mask;
    if (!s->keys[i]) {
        if (++s->count > (s->mask + 1) / 4 * 3)
            die(s->name);
        s->keys[i] = p;
    }
    return i;
}

/* P's slot, or -1. */
static long set_find(const struct ptr_set *s, uintptr_t p)
{
    size_t i = set_slot(s, p);
    while (s->keys[i]) {
        if (s->keys[i] == p)
            return (long)i;
        i = (i + 1) & s->mask;
    }
    return -1;
}

static void set_remove(struct ptr_set *s, uintptr_t p)
{
    long found = set_find(s, p);
    if (found < 0)
        return;
    s->count--;
    /* backward-shift deletion keeps probe chains intact without tombstones */
    size_t i = (size_t)found, j = i;
    for (;;) {
        s->keys[i] = 0;
        for (;;) {
            j = (j + 1) & s->mask;
            if (!s->keys[j])
                return;
            size_t k = set_slot(s, s->keys[j]);
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
                continue;
            break;
        }
        s->keys[i] = s->keys[j];
        if (s->moved)
            s->moved(i, j);
        i = j;
    }
}

/* The chunks the program freed and has not got back, with who freed them. */
static void freed_moved(size_t to, size_t from)
{
    freed_owner[to] = freed_owner[from];
    freed_class[to] = freed_class[from];
}

static struct ptr_set freed_set = {freed, FREED_SLOTS - 1, 0, "too many freed chunks tracked", freed_moved};

static void freed_add(uintptr_t p, int owner, int cls)
{
    size_t i = set_add(&freed_set, p);
    freed_owner[i] = (unsigned char)owner;
    freed_class[i] = (unsigned char)cls;
}

static void freed_remove(uintptr_t p) { set_remove(&freed_set, p); }

/* The chunks hw_malloc gave and hw_free has not taken back: the program holds
 * them through this set (a root in its bss), so that a reproducer leaks only
 * what it drops on purpose, with plain malloc. */
static uintptr_t live[LIVE_SLOTS];
static struct ptr_set live_set = {live, LIVE_SLOTS - 1, 0, "too many live chunks tracked", NULL};

/* ---- threads ------------------------------------------------------------ */

static struct thread_rec *me(void)
{
    if (self)
        return self;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < HW_MAX_THREADS; i++)
        if (!threads[i].used) {
            threads[i].used = 1;
            threads[i].tid = (pid_t)syscall(SYS_gettid);
            self = &threads[i];
            break;
        }
    pthread_mutex_unlock(&lock);
    if (!self)
        die("too many threads");
    return self;
}

/* Frees a fresh chunk into this thread's tcache, where glibc writes the key
 * into its second word.  Taking it back must return the same chunk, which
 * proves it was the list head.  The bin may already be full (a first malloc in
 * a shared arena can stash chunks into a new tcache), so other size classes are
 * tried until one works; chunks of failed tries stay allocated, held in the
 * thread's record with the guards, so that hw itself leaks nothing. */
static char maps_buf[1 << 20];
static uintptr_t scan_buf[(1 << 20) / sizeof(uintptr_t)];
static int current_class(uintptr_t p);

/* /proc/self/maps into maps_buf, as one NUL-terminated text. */
static void read_maps(void)
{
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd < 0)
        die("cannot open /proc/self/maps");
    size_t len = 0;
    ssize_t r;
    while (len < sizeof maps_buf - 1 && (r = read(fd, maps_buf + len, sizeof maps_buf - 1 - len)) > 0)
        len += (size_t)r;
    close(fd);
    maps_buf[len] = 0;
}

/* Before 2.29 a tcache entry has no key: the thread's tcache_perthread_struct (64 one-byte counts, then 64
 * list heads, in a 0x250-byte chunk) is found as the one chunk of that size whose list head of class C is X,
 * a chunk just freed into it, and then read directly; the drain in prove_tcache proves what it says. */
static int keyless(void) { return glibc_major == 2 && glibc_minor < 29; }

static int tcache_count_at(uintptr_t tc, int c)
{
    uintptr_t w;
    if (!peek_word(tc + (uintptr_t)(c & ~7), &w))
        return -1;
    return (int)((w >> (8 * (c & 7))) & 0xff);
}

static uintptr_t tcache_head_at(uintptr_t tc, int c)
{
    uintptr_t w = 0;
    return peek_word(tc + 64 + 8 * (uintptr_t)c, &w) ? w : 0;
}

static uintptr_t find_tcache_struct(uintptr_t x, int c)
{
    read_maps();
    uintptr_t found = 0;
    for (char *line = maps_buf; *line && !found;) {
        char *next = strchr(line, '\n');
        unsigned long lo, hi;
        char perms[8];
        uintptr_t own = (uintptr_t)scan_buf;
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[0] == 'r' && perms[1] == 'w' &&
            !(lo <= own && own < hi)) {
            for (uintptr_t base = lo; base < hi && !found; base += sizeof scan_buf) {
                size_t n = hi - base < sizeof scan_buf ? hi - base : sizeof scan_buf;
                if (!peek(base, scan_buf, n))
                    continue;
                for (size_t w = 0; w < n / sizeof(uintptr_t) && !found; w++) {
                    if (scan_buf[w] != x)
                        continue;
                    uintptr_t tc = base + w * sizeof(uintptr_t) - 64 - 8 * (uintptr_t)c, size = 0;
                    if (peek_word(tc - 8, &size) && (size & ~(uintptr_t)7) == 0x250 && tcache_count_at(tc, c) >= 1)
                        found = tc;
                }
            }
            memset(scan_buf, 0, sizeof scan_buf);
        }
        if (!next)
            break;
        line = next + 1;
    }
    return found;
}

static void learn_key(void)
{
    struct thread_rec *t = me();
    for (size_t request = KEY_PROBE_REQUEST; request > 500; request -= 16) {
        unsigned char *x = malloc(request);
        void *guard = malloc(24);
        if (!x || !guard)
            die("out of memory");
        memset(x, PATTERN, request);
        if (t->nkept < 8)
            t->kept[t->nkept++] = (uintptr_t)guard;
        uintptr_t where = (uintptr_t)x, key = 0, next = 0;
        free(x);
        if (!peek_word(where + 8, &key) || !peek_word(where, &next))
            die("cannot read the key probe chunk");
        if (keyless())
            key = find_tcache_struct(where, tcache_class(request));
        x = malloc(request);
        memset(x, PATTERN, request);
        if ((uintptr_t)x != where) {
            if (t->nkept < 8)
                t->kept[t->nkept++] = (uintptr_t)x;
            continue;
        }
        /* alone in a tcache bin, its link is the list's end (0, or where >> 12 when safe-linked); a
         * chunk above tcache_max went to the unsorted bin, whose links point at the arena */
        if (next != 0 && next != where >> 12) {
            if (t->nkept < 8)
                t->kept[t->nkept++] = (uintptr_t)x;
            continue;
        }
        if (keyless() && key == 0) {
            if (t->nkept < 8)
                t->kept[t->nkept++] = (uintptr_t)x;
            continue;
        }
        if (key == 0 || key == (uintptr_t)0xA5A5A5A5A5A5A5A5ull)
            die("glibc wrote no tcache key (needs glibc 2.29 or later)");
        t->key = key;
        t->held = where; /* stays allocated: the ledger's chunk from this thread's arena */
        t->non_main_arena = (int)((((size_t *)x)[-1] >> 2) & 1);
        return;
    }
    die("no tcache bin took the key probe chunk");
}

static void *malloc_tracked(size_t n, size_t touch)
{
    void *p = malloc(n);
    if (!p)
        die("out of memory");
    pthread_mutex_lock(&lock);
    if (tcache_class(n) >= 0)
        freed_remove((uintptr_t)p);
    set_add(&live_set, (uintptr_t)p);
    pthread_mutex_unlock(&lock);
    memset(p, PATTERN, touch < n ? touch : n);
    return p;
}

void *hw_malloc(size_t n) { return malloc_tracked(n, n); }
void *hw_malloc_cold(size_t n) { return malloc_tracked(n, 64); }

void hw_free(void *p)
{
    int c = tcache_class(malloc_usable_size(p));
    struct thread_rec *t = me();
    pthread_mutex_lock(&lock);
    set_remove(&live_set, (uintptr_t)p);
    if (c >= 0)
        freed_add((uintptr_t)p, (int)(t - threads), c);
    pthread_mutex_unlock(&lock);
    free(p);
}

/* ---- proving a thread's tcache -------------------------------------------- */

static pthread_mutex_t proof_lock = PTHREAD_MUTEX_INITIALIZER;

/* Is P a freed chunk recorded in the set? Returns its owner index or -1. */
static int freed_owner_of(uintptr_t p)
{
    long i = set_find(&freed_set, p);
    return i < 0 ? -1 : freed_owner[i];
}

static int proven_elsewhere(uintptr_t p, const struct thread_rec *t)
{
    for (int i = 0; i < HW_MAX_THREADS; i++) {
        const struct thread_rec *o = &threads[i];
        if (o == t || !o->in_ledger)
            continue;
        for (int c = 0; c < TC_CLASSES; c++)
            for (int j = 0; j < o->count[c]; j++)
                if (o->entries[c][j] == p)
                    return 1;
    }
    return 0;
}

/* Current tcache class of the chunk whose user memory starts at P, from its
 * size field, or -1 when it is not a tcache-sized chunk. */
static int current_class(uintptr_t p)
{
    uintptr_t size;
    if (!peek_word(p - 8, &size))
        return -1;
    size &= ~(uintptr_t)7;
    return (size >= 32 && size <= 0x410 && size % 16 == 0) ? (int)((size - 32) / 16) : -1;
}

static void add_candidate(struct thread_rec *t, uintptr_t (*cand)[TC_CAP], int *ncand, uintptr_t p)
{
    int c = current_class(p);
    if (c < 0)
        return;
    int me_index = (int)(t - threads);
    int owner = freed_owner_of(p);
    /* A chunk another thread's proof holds is that thread's, whoever freed it
     * (the process-wide key since 2.34 does not tell tcaches apart). */
    if (owner != me_index && proven_elsewhere(p, t))
        return;
    /* A chunk nobody freed at this address (a split remainder that glibc
     * stashed into tcache) is taken as ours: the drain below proves it. */
    if (owner == me_index || owner < 0) {
        for (int j = 0; j < ncand[c]; j++)
            if (cand[c][j] == p)
                return;
        if (ncand[c] >= TC_CAP)
            die("more tcache candidates than a bin can hold");
        cand[c][ncand[c]++] = p;
        return;
    }
    if (owner >= 0 && !threads[owner].in_ledger && !threads[owner].exited)
        return;
    fprintf(stderr, "thread %d: chunk %#lx carries the tcache key but nobody can account for it (owner %d)\n",
            t->tid, (unsigned long)p, owner);
    die("tcache ledger would be incomplete");
}

/* Scans the writable mapping that holds ADDR for chunks carrying T's key. */
static void scan_mapping_of(uintptr_t addr, struct thread_rec *t, uintptr_t (*cand)[TC_CAP], int *ncand,
                            uintptr_t *done, int *ndone)
{
    read_maps();
    for (char *line = maps_buf; *line;) {
        char *next = strchr(line, '\n');
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= addr && addr < hi && perms[1] == 'w') {
            for (int i = 0; i < *ndone; i++)
                if (done[i] == lo)
                    return;
            done[(*ndone)++] = lo;
            for (uintptr_t base = lo; base < hi; base += sizeof scan_buf) {
                size_t n = hi - base < sizeof scan_buf ? hi - base : sizeof scan_buf;
                if (!peek(base, scan_buf, n))
                    continue;
                for (size_t w = 1; w < n / sizeof(uintptr_t); w += 2)
                    if (scan_buf[w] == t->key)
                        add_candidate(t, cand, ncand, base + (w - 1) * sizeof(uintptr_t));
            }
            /* the copy holds the heap's pointers: a leak scan of the core must not see them twice */
            memset(scan_buf, 0, sizeof scan_buf);
            return;
        }
        if (!next)
            break;
        line = next + 1;
    }
}

/* Proves the calling thread's tcache, class by class (see hw.h). */
static void prove_tcache(struct thread_rec *t)
{
    static uintptr_t cand[TC_CLASSES][TC_CAP];
    static uintptr_t done[64];
    int ncand[TC_CLASSES] = { 0 }, ndone = 0;
    int me_index = (int)(t - threads);
    pthread_mutex_lock(&proof_lock);
    if (keyless()) {
        for (int c = 0; c < TC_CLASSES; c++) {
            int n = tcache_count_at(t->key, c);
            uintptr_t p = tcache_head_at(t->key, c);
            if (n < 0 || n > TC_CAP)
                die("cannot read the tcache struct's counts");
            for (int i = 0; i < n; i++) {
                if (!p || current_class(p) != c)
                    die("a tcache list is shorter than its count, or holds a chunk of another size");
                cand[c][ncand[c]++] = p;
                if (!peek_word(p, &p))
                    die("cannot read a tcache entry");
            }
        }
    } else {
        pthread_mutex_lock(&lock);
        scan_mapping_of(t->held, t, cand, ncand, done, &ndone);
        for (size_t s = 0; s < FREED_SLOTS; s++)
            if (freed[s] && freed_owner[s] == me_index && ndone < 64)
                scan_mapping_of(freed[s], t, cand, ncand, done, &ndone);
        pthread_mutex_unlock(&lock);
    }
    for (int c = 0; c < TC_CLASSES; c++) {
        int n = ncand[c];
        uintptr_t *got = t->entries[c];
        for (int i = 0; i < n; i++)
            got[i] = (uintptr_t)malloc(class_request(c));
        for (int i = 0; i < n; i++) {
            int found = 0;
            for (int j = 0; j < n; j++)
                found |= got[i] == cand[c][j];
            if (!found) {
                fprintf(stderr, "thread %d: malloc(%zu) gave %#lx, which is not a tcache candidate\n", t->tid,
                        class_request(c), (unsigned long)got[i]);
                die("tcache proof failed");
            }
        }
        for (int i = n - 1; i >= 0; i--)
            free((void *)got[i]);
        for (int i = 0; i < n; i++) {
            uintptr_t k;
            if (keyless() ? tcache_head_at(t->key, c) != got[0] || tcache_count_at(t->key, c) != n
                          : !peek_word(got[i] + 8, &k) || k != t->key)
                die("a tcache entry lost its key after the proof");
        }
        t->count[c] = n;
    }
    t->in_ledger = 1;
    pthread_mutex_unlock(&proof_lock);
}

void hw_ledger(const char *label)
{
    struct thread_rec *t = me();
    snprintf(t->label, sizeof t->label, "%s", label);
    prove_tcache(t);
}

void hw_note_mmapped(void *p, size_t request)
{
    if (!((((size_t *)p)[-1] >> 1) & 1))
        die("hw_note_mmapped: the chunk is not mmapped (IS_MMAPPED is clear)");
    pthread_mutex_lock(&lock);
    if (nmmapped < MAX_MMAPPED) {
        mmapped[nmmapped].mem = (uintptr_t)p;
        mmapped[nmmapped].request = request;
        nmmapped++;
    }
    pthread_mutex_unlock(&lock);
}

void hw_note_large_tcache(void *p)
{
    uintptr_t key = 0, size = 0;
    struct thread_rec *t = me();
    if (!peek_word((uintptr_t)p + 8, &key) || !peek_word((uintptr_t)p - 8, &size))
        return; /* an mmapped chunk that free unmapped */
    if (keyless() || key != t->key || (size & ~(uintptr_t)7) <= 0x410)
        return; /* not in tcache (or in a small bin, which the proof covers) */
    pthread_mutex_lock(&lock);
    if (nlarge < MAX_MMAPPED) {
        large_tcache[nlarge].mem = (uintptr_t)p;
        large_tcache[nlarge].size = size & ~(uintptr_t)7;
        large_tcache[nlarge].mmapped = (int)((size >> 1) & 1);
        nlarge++;
    }
    pthread_mutex_unlock(&lock);
}

__attribute__((noinline)) void hw_scrub(void *p, size_t n)
{
    memset(p, 0, n);
    __asm__ volatile("" : : "r"(p) : "memory");
}

__attribute__((noinline)) void hw_scrub_stack(void)
{
    char pad[64 << 10];
    hw_scrub(pad, sizeof pad);
}

void hw_note_fact(const char *key, long long value)
{
    pthread_mutex_lock(&lock);
    if (nfacts < MAX_FACTS) {
        snprintf(facts[nfacts].key, sizeof facts[nfacts].key, "%s", key);
        facts[nfacts].value = value;
        nfacts++;
    }
    pthread_mutex_unlock(&lock);
}

/* ---- outputs -------------------------------------------------------------- */

static const char *out_dir = ".";

int hw_output_fd(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        exit(2);
    }
    return fd;
}

static FILE *open_output(const char *dir, const char *name, char *buf, size_t size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    setvbuf(f, buf, _IOFBF, size);
    return f;
}

void hw_init(int argc, char **argv, const char *reproducer_name)
{
    repro_name = reproducer_name;
    const char *dir = argc > 1 ? argv[1] : ".";
    out_dir = dir;
    if (sscanf(gnu_get_libc_version(), "%d.%d", &glibc_major, &glibc_minor) != 2)
        die("cannot parse gnu_get_libc_version()");
    fill_count = (glibc_major > 2 || glibc_minor >= 43) ? 16 : 7;
    const char *env_fill = getenv("HW_TCACHE_FILL");
    if (env_fill)
        fill_count = atoi(env_fill);
    sem_init(&arrivals, 0, 0);
    mi_file = open_output(dir, "malloc_info.xml", mi_buf, sizeof mi_buf);
    ledger_file = open_output(dir, "ledger.json", ledger_buf, sizeof ledger_buf);
    trim_fd = hw_output_fd("trim.json");
    if (glibc_major == 2 && glibc_minor < 26)
        die("the tcache ledger needs glibc 2.26 or later");
    learn_key();
}

static void write_ledger(void)
{
    FILE *f = ledger_file;
    fprintf(f, "{\n  \"reproducer\": \"%s\",\n  \"glibc\": \"%d.%d\",\n  \"pid\": %d,\n  \"tcache_fill\": %d,\n",
            repro_name, glibc_major, glibc_minor, (int)getpid(), fill_count);
    fprintf(f, "  \"facts\": {");
    for (int i = 0; i < nfacts; i++)
        fprintf(f, "%s\"%s\": %lld", i ? ", " : "", facts[i].key, facts[i].value);
    fprintf(f, "},\n  \"mmapped\": [");
    for (int i = 0; i < nmmapped; i++)
        fprintf(f, "%s\n    {\"mem\": %lu, \"request\": %zu}", i ? "," : "", (unsigned long)mmapped[i].mem,
                mmapped[i].request);
    fprintf(f, "\n  ],\n  \"large_tcache\": [");
    for (int i = 0; i < nlarge; i++)
        fprintf(f, "%s\n    {\"mem\": %lu, \"chunk_size\": %lu, \"mmapped\": %s}", i ? "," : "",
                (unsigned long)large_tcache[i].mem, (unsigned long)large_tcache[i].size,
                large_tcache[i].mmapped ? "true" : "false");
    fprintf(f, "\n  ],\n  \"threads\": [");
    int first = 1;
    for (int i = 0; i < HW_MAX_THREADS; i++) {
        struct thread_rec *t = &threads[i];
        if (!t->in_ledger)
            continue;
        fprintf(f, "%s\n    {\"tid\": %d, \"label\": \"%s\", \"held\": %lu, \"non_main_arena\": %s, \"tcache\": [",
                first ? "" : ",", (int)t->tid, t->label, (unsigned long)t->held, t->non_main_arena ? "true" : "false");
        first = 0;
        int firstbin = 1;
        for (int c = 0; c < TC_CLASSES; c++) {
            if (!t->count[c])
                continue;
            fprintf(f, "%s\n       {\"chunk_size\": %d, \"entries\": [", firstbin ? "" : ",", 32 + 16 * c);
            firstbin = 0;
            for (int j = 0; j < t->count[c]; j++)
                fprintf(f, "%s%lu", j ? ", " : "", (unsigned long)t->entries[c][j]);
            fprintf(f, "]}");
        }
        fprintf(f, "]}");
    }
    fprintf(f, "\n  ]\n}\n");
}

/* Anonymous resident memory of this process in bytes, read without allocating. */
static long rss_anon(void)
{
    static char buf[8192];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0)
        die("cannot open /proc/self/status");
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        die("cannot read /proc/self/status");
    buf[n] = 0;
    char *line = strstr(buf, "RssAnon:");
    if (!line)
        die("no RssAnon in /proc/self/status");
    return strtol(line + 8, NULL, 10) * 1024;
}

/* After the core: what malloc_trim(0) really gives back (trim.json). */
static void measure_trim(void)
{
    static char out[256];
    long before = rss_anon();
    int released = malloc_trim(0);
    long after = rss_anon();
    int n = snprintf(out, sizeof out, "{\"rss_anon_before\": %ld, \"rss_anon_after\": %ld, \"returned\": %d}\n",
                     before, after, released);
    if (write(trim_fd, out, (size_t)n) != n || close(trim_fd) != 0)
        die("cannot write trim.json");
}

void hw_snapshot(void)
{
    if (malloc_info(0, mi_file) != 0)
        die("malloc_info failed");
    write_ledger();
    if (fflush(mi_file) || fflush(ledger_file))
        die("cannot write the oracle files");
    raise(SIGSTOP);
    measure_trim();
}

void hw_park(void)
{
    for (;;)
        pause();
}

void hw_arrive(void) { sem_post(&arrivals); }

void hw_wait_arrivals(int n)
{
    for (int i = 0; i < n; i++)
        while (sem_wait(&arrivals) != 0 && errno == EINTR)
            ;
}

struct spawn_arg { void *(*fn)(void *); void *arg; int learn; };
static struct spawn_arg spawn_args[HW_MAX_THREADS];
static int nspawned;

static void *trampoline(void *a)
{
    struct spawn_arg *s = a;
    if (s->learn)
        learn_key();
    void *r = s->fn(s->arg);
    me()->exited = 1;
    return r;
}

static void *bystander(void *arg)
{
    (void)arg;
    struct thread_rec *t = me();
    snprintf(t->label, sizeof t->label, "bystander");
    t->in_ledger = 1; /* no key, no held chunk, an empty tcache: it never touched malloc */
    hw_arrive();
    hw_park();
}

static void spawn(void *(*fn)(void *), void *arg, int learn);

void hw_spawn(void *(*fn)(void *), void *arg) { spawn(fn, arg, 1); }
void hw_spawn_bystander(void) { spawn(bystander, NULL, 0); }

static void spawn(void *(*fn)(void *), void *arg, int learn)
{
    pthread_attr_t attr;
    pthread_t th;
    pthread_mutex_lock(&lock);
    if (nspawned >= HW_MAX_THREADS)
        die("too many threads");
    struct spawn_arg *s = &spawn_args[nspawned++];
    pthread_mutex_unlock(&lock);
    s->fn = fn;
    s->arg = arg;
    s->learn = learn;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, trampoline, s) != 0)
        die("pthread_create failed");
    pthread_attr_destroy(&attr);
}
