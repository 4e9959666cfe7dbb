/* untouched: a running process with memory it mapped and barely touched, for the tests that a capture or a
 * live read allocates and maps nothing in the process it reads (tests/live/test_untouched.py).
 *
 * Usage: untouched DIR [FILE].  It maps, and touches only the first MiB (or page) of:
 *   - 128 MiB of shared anonymous memory (MAP_SHARED|MAP_ANONYMOUS), first 1 MiB written;
 *   - 64 MiB of a memfd (shmem) mapped shared, first 1 MiB written;
 *   - 32 MiB of private anonymous memory, 8 pages written;
 *   - FILE (when given), mapped private and writable, never written: what a library's data looks like;
 *   - malloc'd chunks big enough to be mmapped (8 MiB, 3 MiB), only their first 64 bytes written, one by a
 *     thread that also fills its arena a little;
 * then overwrites its environment block in place with its title (as php-fpm and others do), writes
 * DIR/ledger.json (what it mapped, written with write(2) from a static buffer) and DIR/state ("0"), and
 * sleeps until killed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1UL << 20)

extern char **environ;
static sem_t thread_done;
static void *volatile thread_chunk;
static void *volatile thread_small[64];
static char ledger[8192];

static void *worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < 64; i++) {
        thread_small[i] = malloc(200 + 16 * i);
        memset(thread_small[i], 0x33, 200);
    }
    for (int i = 0; i < 64; i += 2)
        free(thread_small[i]);
    thread_chunk = malloc(3 * MiB);
    memset(thread_chunk, 0x44, 64);
    sem_post(&thread_done);
    for (;;)
        pause();
    return NULL;
}

static void fail(const char *what)
{
    perror(what);
    exit(1);
}

/* Writes the title over the environment strings, as setproctitle does: the block /proc/PID/environ shows. */
static void overwrite_environment(void)
{
    char *first = NULL, *last = NULL;
    for (char **e = environ; e && *e; e++) {
        if (!first || *e < first)
            first = *e;
        if (!last || *e + strlen(*e) > last)
            last = *e + strlen(*e);
    }
    if (!first)
        return;
    const char *title = "untouched: serving";
    size_t n = (size_t)(last - first);
    memset(first, 0, n);
    memcpy(first, title, strlen(title) < n ? strlen(title) : n);
    clearenv();
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        fail("untouched: output");
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        fail("untouched: write");
    close(fd);
    rename(tmp, path);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: untouched DIR [FILE]\n");
        return 2;
    }
    const char *dir = argv[1];
    char *shared = mmap(NULL, 128 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        fail("untouched: shared");
    memset(shared, 0x5a, MiB);

    int memfd = memfd_create("untouched-shm", 0);
    if (memfd < 0 || ftruncate(memfd, 64 * MiB) != 0)
        fail("untouched: memfd");
    char *shm = mmap(NULL, 64 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (shm == MAP_FAILED)
        fail("untouched: memfd mmap");
    memset(shm, 0x6b, MiB);

    char *private = mmap(NULL, 32 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (private == MAP_FAILED)
        fail("untouched: private");
    for (int i = 0; i < 8; i++)
        private[(size_t)i * 4096 * 97] = (char)(i + 1);

    char *filemap = NULL;
    size_t filesize = 0;
    if (argc > 2) {
        int fd = open(argv[2], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0)
            fail("untouched: file");
        filesize = (size_t)st.st_size;
        filemap = mmap(NULL, filesize, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (filemap == MAP_FAILED)
            fail("untouched: file mmap");
        close(fd);
    }

    char *big = malloc(8 * MiB);
    memset(big, 0x55, 64);
    sem_init(&thread_done, 0, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0)
        fail("untouched: thread");
    sem_wait(&thread_done);

    overwrite_environment();
    snprintf(ledger, sizeof ledger,
             "{\"shared\": [%lu, %lu, %lu], \"memfd\": [%lu, %lu, %lu], \"private\": [%lu, %lu, %lu],\n"
             " \"file\": [%lu, %lu], \"mmapped\": [[%lu, %lu], [%lu, %lu]]}\n",
             (unsigned long)shared, 128 * MiB, MiB, (unsigned long)shm, 64 * MiB, MiB, (unsigned long)private,
             32 * MiB, 8 * 4096UL, (unsigned long)filemap, (unsigned long)filesize, (unsigned long)big - 16,
             8 * MiB, (unsigned long)thread_chunk - 16, 3 * MiB);
    write_file(dir, "ledger.json", ledger);
    write_file(dir, "state", "0\n");
    for (;;)
        pause();
}
