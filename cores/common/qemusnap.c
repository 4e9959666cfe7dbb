/* Preloaded into a reproducer that runs under qemu-user (cores/scripts/foreign.py), built for its
 * architecture: where the reproducer stops itself for gcore (raise(SIGSTOP) or kill(getpid(), SIGSTOP)),
 * writes what an arm64 kernel's core holds and qemu's does not, then aborts, and qemu writes the program's
 * core (cores/scripts/qemucore.py completes it with this):
 *
 *   process.txt  in the working folder: "thread TID POINTER" for each thread that ever ran (the main one,
 *                then each one pthread_create started, noted as it starts), "memory START LENGTH" for each
 *                page of memory.bin, then /proc/self/maps as qemu shows it to the program (the guest's
 *                mappings)
 *   memory.bin   the page (the program's, AT_PAGESZ) that holds each thread's thread pointer, read by the
 *                program itself: with pages larger than its host's, qemu leaves part of such a page out of
 *                its maps and its core (the main thread's control block and TLS among ld.so's data)
 *
 * It allocates nothing, so the heap stays as the reproducer's allocator printed it; the real functions are
 * looked up in its constructor, before the program runs.  Built with -DQEMUSNAP_WRAP it is linked into a
 * static program instead (with -Wl,--wrap=pthread_create,--wrap=raise,--wrap=kill), where there is nothing to
 * preload into and no dynamic linker to look the real functions up. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_THREADS 1024

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
typedef int (*raise_fn)(int);
typedef int (*kill_fn)(pid_t, int);

#ifdef QEMUSNAP_WRAP
int __real_pthread_create(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
int __real_raise(int);
int __real_kill(pid_t, int);
#define real_create __real_pthread_create
#define real_raise __real_raise
#define real_kill __real_kill
#define pthread_create __wrap_pthread_create
#define raise __wrap_raise
#define kill __wrap_kill
#else
static create_fn real_create;
static raise_fn real_raise;
static kill_fn real_kill;
#endif
static struct { long tid; unsigned long pointer; } seen[MAX_THREADS];
static struct { void *(*fn)(void *); void *arg; } starts[MAX_THREADS];
static int nseen, nstarts;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void note(void)
{
    pthread_mutex_lock(&lock);
    if (nseen < MAX_THREADS) {
        seen[nseen].tid = (long)syscall(SYS_gettid);
        seen[nseen++].pointer = (unsigned long)__builtin_thread_pointer();
    }
    pthread_mutex_unlock(&lock);
}

__attribute__((constructor)) static void begin(void)
{
#ifndef QEMUSNAP_WRAP
    real_create = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
    real_raise = (raise_fn)dlsym(RTLD_NEXT, "raise");
    real_kill = (kill_fn)dlsym(RTLD_NEXT, "kill");
#endif
    note();
}

static void *started(void *slot)
{
    int i = (int)(long)slot;
    note();
    return starts[i].fn(starts[i].arg);
}

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    int i = __atomic_fetch_add(&nstarts, 1, __ATOMIC_SEQ_CST);
    if (i >= MAX_THREADS)
        abort();
    starts[i].fn = fn;
    starts[i].arg = arg;
    return real_create(thread, attr, started, (void *)(long)i);
}

static void put(int fd, const char *text, size_t n)
{
    while (n) {
        ssize_t w = write(fd, text, n);
        if (w <= 0)
            abort();
        text += w;
        n -= (size_t)w;
    }
}

/* Copies the page at START (LENGTH bytes) to FD through BUF (SIZE bytes): a copy the program makes, where qemu
 * would refuse to write from the page itself. */
static void copy_page(int fd, unsigned long start, unsigned long length, char *buf, size_t size)
{
    for (unsigned long at = 0; at < length; at += size) {
        memcpy(buf, (const char *)(start + at), size);
        put(fd, buf, size);
    }
}

static void snapshot(void)
{
    static char buf[4096];
    int fd = open("process.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644), maps = open("/proc/self/maps", O_RDONLY);
    int pages = open("memory.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || maps < 0 || pages < 0)
        abort();
    unsigned long page = (unsigned long)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < nseen; i++)
        put(fd, buf, (size_t)snprintf(buf, sizeof buf, "thread %ld %#lx\n", seen[i].tid, seen[i].pointer));
    for (int i = 0; i < nseen; i++) {
        unsigned long start = seen[i].pointer & ~(page - 1);
        put(fd, buf, (size_t)snprintf(buf, sizeof buf, "memory %#lx %#lx\n", start, page));
        copy_page(pages, start, page, buf, sizeof buf);
    }
    close(pages);
    ssize_t n;
    while ((n = read(maps, buf, sizeof buf)) > 0)
        put(fd, buf, (size_t)n);
    close(maps);
    close(fd);
    abort();
}

int raise(int sig)
{
    if (sig == SIGSTOP)
        snapshot();
    return real_raise(sig);
}

int kill(pid_t pid, int sig)
{
    if (sig == SIGSTOP && pid == getpid())
        snapshot();
    return real_kill(pid, sig);
}
