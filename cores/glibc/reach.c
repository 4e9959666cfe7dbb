/* reach: blocks the program can still reach from each kind of root, and blocks it leaked in each way, with
 * a ledger of which is which (reach.txt), for heapwalk's leak scan.
 *
 * Reached: from a global, a static array, an interior pointer, a chain through other blocks, an anonymous
 * mmap region, an in-use mmapped chunk, the live stack of main, the stack and the TLS of parked threads.
 * Leaked: single blocks dropped, a ring whose every node another node points to, a tree, a block whose only
 * pointer lies in a freed chunk, blocks a thread dropped in its own arena, a leaked block that points to a
 * reached one.
 *
 * The ledger is written with write(2) from a buffer scrubbed after each line, the builders are separate
 * functions whose frames are gone by the snapshot, and the dead stack below is scrubbed too, so that no
 * stray copy of a leaked pointer survives anywhere a scan would see it.  Each ledger line is
 *   reached KIND ADDRESS
 *   leaked KIND ADDRESS UNREFERENCED HOLDS_COUNT HOLDS_BYTES
 * with the user pointer in hex; an unreferenced block (no other leaked block points to it) holds the leaked
 * blocks it leads to, itself included, their chunk sizes summed (malloc_usable_size + 8).
 */
#include "hw.h"

#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define WORKERS 3

static int ledger_fd = -1;
static char line[160];
static pthread_mutex_t line_lock = PTHREAD_MUTEX_INITIALIZER;   /* the workers write lines too */

void *volatile g_single;                  /* a global */
static void *volatile g_array[4];         /* a static array */
static void *volatile g_interior;         /* 100 bytes into a block */
static void *volatile g_chain;            /* the head of a chain of three blocks */
static void *volatile *volatile g_anon;   /* an anonymous mapping holding a pointer */
static void *volatile g_big;              /* an mmapped chunk holding a pointer */
static __thread void *volatile tls_keep;  /* a parked thread's TLS */

static char *put(char *o, const char *s)
{
    while (*s)
        *o++ = *s++;
    return o;
}

static char *put_number(char *o, unsigned long v, unsigned base)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    if (base == 16)
        o = put(o, "0x");
    while (n)
        *o++ = digits[--n];
    hw_scrub(digits, sizeof digits);
    return o;
}

static long chunk_size(void *p) { return (long)malloc_usable_size(p) + 8; }

static NOINLINE void note(const char *verdict, const char *kind, void *p, int unreferenced, long count, long bytes)
{
    pthread_mutex_lock(&line_lock);
    char *o = put(line, verdict);
    o = put(put(o, " "), kind);
    o = put_number(put(o, " "), (unsigned long)(uintptr_t)p, 16);
    if (verdict[0] == 'l') {
        o = put_number(put(o, " "), (unsigned long)unreferenced, 10);
        o = put_number(put(o, " "), (unsigned long)count, 10);
        o = put_number(put(o, " "), (unsigned long)bytes, 10);
    }
    o = put(o, "\n");
    if (write(ledger_fd, line, (size_t)(o - line)) != o - line)
        abort();
    hw_scrub(line, sizeof line);
    pthread_mutex_unlock(&line_lock);
}

/* A fresh block of N bytes filled with a pattern that is no pointer. */
static NOINLINE void *block(size_t n)
{
    void *p = malloc(n);
    if (!p)
        abort();
    memset(p, 0x5a, n);
    return p;
}

static NOINLINE void build_reached(void)
{
    g_single = block(40);
    note("reached", "global", g_single, 0, 0, 0);
    for (int i = 0; i < 4; i++) {
        g_array[i] = block(64 + 32 * (size_t)i);
        note("reached", "static_array", g_array[i], 0, 0, 0);
    }
    char *inner = block(200);
    g_interior = inner + 100;
    note("reached", "interior", inner, 0, 0, 0);
    void **a = block(48), **b = block(48), **c = block(48);
    a[0] = b;
    b[1] = c;
    g_chain = a;
    note("reached", "chain", a, 0, 0, 0);
    note("reached", "chain", b, 0, 0, 0);
    note("reached", "chain", c, 0, 0, 0);
    void **anon = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED)
        abort();
    anon[5] = block(80);
    g_anon = (void *volatile *)anon;
    note("reached", "anonymous", anon[5], 0, 0, 0);
    size_t big_size = 4 << 20;
    void **big = malloc(big_size);
    if (!big)
        abort();
    memset(big, 0x5a, 4096);
    big[3] = block(96);
    g_big = big;
    hw_note_mmapped(big, big_size);
    note("reached", "mmapped", big[3], 0, 0, 0);
}

static NOINLINE void build_leaked(void)
{
    static const size_t singles[] = {24, 500, 3000};
    for (int i = 0; i < 3; i++) {
        void *p = block(singles[i]);
        note("leaked", "single", p, 1, 1, chunk_size(p));
    }
    void **ring[5];
    for (int i = 0; i < 5; i++)
        ring[i] = block(64);
    for (int i = 0; i < 5; i++) {
        ring[i][0] = ring[(i + 1) % 5];
        note("leaked", "ring", ring[i], 0, 0, 0);
    }
    hw_scrub(ring, sizeof ring);
    void **tree[7];
    long bytes = 0;
    for (int i = 0; i < 7; i++) {
        tree[i] = block(i < 3 ? 48 : 32);
        bytes += chunk_size(tree[i]);
    }
    for (int i = 0; i < 3; i++) {
        tree[i][0] = tree[2 * i + 1];
        tree[i][1] = tree[2 * i + 2];
    }
    for (int i = 0; i < 7; i++)
        note("leaked", "tree", tree[i], i == 0, i == 0 ? 7 : 0, i == 0 ? bytes : 0);
    hw_scrub(tree, sizeof tree);
    void *only = block(120);
    void **freed = block(256);
    freed[6] = only;
    hw_free(freed);
    note("leaked", "in_freed_chunk", only, 1, 1, chunk_size(only));
    void **toward = block(40);
    toward[0] = g_single;
    note("leaked", "points_to_reached", toward, 1, 1, chunk_size(toward));
}

static NOINLINE void worker_blocks(long role)
{
    if (role == 1) {
        tls_keep = block(88);
        note("reached", "tls", tls_keep, 0, 0, 0);
    } else if (role == 2) {
        void *dropped = block(1000);
        note("leaked", "thread_single", dropped, 1, 1, chunk_size(dropped));
        void **head = block(56), **tail = block(56);
        head[2] = tail;
        note("leaked", "thread_chain", head, 1, 2, chunk_size(head) + chunk_size(tail));
        note("leaked", "thread_chain", tail, 0, 0, 0);
    }
}

static void *worker(void *arg)
{
    long role = (long)arg;
    void *volatile on_stack = NULL;
    if (role == 0) {
        on_stack = block(72);
        note("reached", "thread_stack", on_stack, 0, 0, 0);
    }
    worker_blocks(role);
    hw_scrub_stack();
    hw_ledger("worker");
    hw_scrub_stack();
    hw_arrive();
    hw_park();
    (void)on_stack;
}

int main(int argc, char **argv)
{
    hw_init(argc, argv, "reach");
    ledger_fd = hw_output_fd("reach.txt");
    void *volatile on_main_stack = block(56);
    note("reached", "live_stack", on_main_stack, 0, 0, 0);
    build_reached();
    build_leaked();
    for (long i = 0; i < WORKERS; i++)
        hw_spawn(worker, (void *)i);
    hw_wait_arrivals(WORKERS);
    hw_scrub_stack();
    hw_ledger("main");
    hw_scrub_stack();
    hw_snapshot();
    (void)on_main_stack;
    return 0;
}
