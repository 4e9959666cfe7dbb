/* Support for heapwalk's reproducer programs.
 *
 * A reproducer builds one heap situation, then calls hw_snapshot(), which writes
 * two oracle files into the output directory given as argv[1] and stops the
 * process with SIGSTOP so that the harness can take a core with gcore:
 *
 *   malloc_info.xml  glibc's own malloc_info(0, f) at the snapshot instant
 *   ledger.json      what the program knows: each live thread's tcache bins
 *                    (addresses, list order), a chunk each thread holds (its
 *                    key-probe chunk) and whether it came from a thread arena,
 *                    the mmapped chunks
 *
 * Nothing here allocates after hw_init() except the program's own requests:
 * both FILEs are opened at start with static setvbuf buffers.
 *
 * How a thread learns its own tcache, without knowing glibc's layouts:
 * every allocation goes through hw_malloc/hw_free, which keep the set of chunks
 * the program freed and has not got back, with the freeing thread.  glibc 2.29+
 * writes a per-tcache key into the second word of each chunk it caches and
 * clears it when the chunk leaves; the thread learns its key once, at start,
 * from a chunk it frees into an unused bin.  At its ledger point (hw_ledger) the
 * thread takes its freed chunks that carry the key as candidates, then proves
 * them per size class: it mallocs as many chunks as there are candidates (glibc
 * hands out the tcache list head first, which gives the list order), checks
 * that exactly the candidates came back, and frees them in reverse order, which
 * rebuilds the same list.  A disagreement aborts the program, so a wrong ledger
 * never reaches the tests.
 */
#ifndef HW_H
#define HW_H
#include <stddef.h>
#include <stdint.h>

#define HW_MAX_THREADS 256

/* Opens the output files, learns the glibc version and tcache fill count,
 * and the main thread's tcache key. */
void hw_init(int argc, char **argv, const char *reproducer_name);

/* malloc/free that keep the set of freed chunks up to date.  Every byte
 * returned by hw_malloc is written (pattern fill), so its pages are resident. */
void *hw_malloc(size_t n);
void hw_free(void *p);
/* Like hw_malloc, but writes only the first 64 bytes: for bulk memory that
 * need not be resident (untouched pages stay out of the core's data). */
void *hw_malloc_cold(size_t n);

/* Records the calling thread in the ledger with its role `label` and proves
 * its tcache contents (see above).  Call it last, just before the thread
 * parks (workers) or before hw_snapshot (main thread). */
void hw_ledger(const char *label);

/* A file NAME in the output directory, opened for write(2) (which allocates
 * nothing); exits when it cannot be created. */
int hw_output_fd(const char *name);

/* Writes zeros over N bytes at P in a way the compiler cannot drop, so that no
 * stray copy of a pointer survives there for a leak scan to see. */
void hw_scrub(void *p, size_t n);
/* Writes zeros over 64 KiB of the stack below the caller: the dead frames of
 * the functions it called. */
void hw_scrub_stack(void);

/* Records an mmapped chunk the program keeps until the snapshot. */
void hw_note_mmapped(void *p, size_t request);

/* After free(p) of a chunk above the small tcache sizes: records it in the
 * ledger's "large_tcache" list if it carries this thread's tcache key, i.e.
 * glibc 2.42+ put it into a large tcache bin. */
void hw_note_large_tcache(void *p);

/* Extra integer facts for the ledger ("key": value). */
void hw_note_fact(const char *key, long long value);

/* glibc's tcache fill count for this process (7, or 16 from 2.43). */
int hw_tcache_fill(void);

/* Writes malloc_info.xml and ledger.json, then stops the process (SIGSTOP).
 * All other threads must be parked (not inside malloc) before this is called.
 * When resumed (SIGCONT), it calls malloc_trim(0) and writes trim.json: the
 * anonymous RSS before and after (measured without allocating), then returns
 * so the program may end. */
void hw_snapshot(void);

/* Parks the calling thread forever without touching the heap. */
void hw_park(void) __attribute__((noreturn));

/* A counting barrier that does not allocate: hw_arrive() by each worker,
 * hw_wait_arrivals(n) by the main thread. */
void hw_arrive(void);
void hw_wait_arrivals(int n);

/* Starts a detached thread with a small stack (keeps cores small).  The thread
 * learns its tcache key before `fn` runs. */
void hw_spawn(void *(*fn)(void *), void *arg);

/* Starts a thread that never calls malloc or free, then arrives and parks:
 * glibc gives it no arena and no tcache (a NULL tcache pointer, or from 2.43
 * one to libc's read-only dummy).  The ledger lists it with held = 0. */
void hw_spawn_bystander(void);

#endif
