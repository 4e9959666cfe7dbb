/* Memory of every kind of owner, with a ledger of what was mapped and touched (issue 41): a pool this program
 * maps itself beside malloc (8 MiB, 5 MiB of it touched), a POSIX shared memory segment (4 MiB, 3 MiB touched),
 * and three threads whose stacks (512 KiB each) are touched to known depths (64, 128 and 192 KiB) before they
 * park; malloc holds a few MiB.  The ledger (ledger.json in the folder given as the first argument) is written
 * with write(2) from a static buffer; then the process stops itself (SIGSTOP) for the capture. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KiB 1024UL
#define MiB (1024UL * KiB)
#define POOL (8 * MiB)
#define POOL_TOUCHED (5 * MiB)
#define SHM (4 * MiB)
#define SHM_TOUCHED (3 * MiB)
#define STACK (512 * KiB)
#define THREADS 3

static char ledger[4096];
static size_t used;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int parked;

static void note(const char *text)
{
    size_t n = strlen(text);
    if (used + n < sizeof ledger) {
        memcpy(ledger + used, text, n);
        used += n;
    }
}

/* Touches DEPTH bytes of this thread's stack below the current frame, page by page. */
static void __attribute__((noinline)) dig(size_t depth)
{
    volatile char *frame = alloca(depth);
    for (size_t at = 0; at < depth; at += 4096)
        frame[at] = 1;
    frame[depth - 1] = 1;
}

static void *worker(void *arg)
{
    size_t depth = (size_t)arg;
    dig(depth);
    char line[160];
    snprintf(line, sizeof line, "%s{\"tid\": %ld, \"depth\": %zu}", parked ? ", " : "", (long)syscall(SYS_gettid),
             depth);
    pthread_mutex_lock(&lock);
    note(line);
    parked++;
    pthread_mutex_unlock(&lock);
    for (;;)
        pause();
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    /* the pool between two inaccessible pages, so that the kernel never joins it to a writable mapping made
     * beside it later (a row of its own, of exactly its size, whatever lands next to it) */
    long page = sysconf(_SC_PAGESIZE);
    char *reserved = mmap(NULL, POOL + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (reserved == MAP_FAILED || mprotect(reserved + page, POOL, PROT_READ | PROT_WRITE) != 0)
        return 1;
    char *pool = reserved + page;
    memset(pool, 3, POOL_TOUCHED);
    char name[64];
    snprintf(name, sizeof name, "/heapwalk-rss-%d", (int)getpid());
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)SHM) != 0)
        return 1;
    char *shm = mmap(NULL, SHM, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shm == MAP_FAILED)
        return 1;
    shm_unlink(name);                  /* the mapping stays, named "/dev/shm/... (deleted)" */
    memset(shm, 4, SHM_TOUCHED);
    char *volatile held[64];
    for (int i = 0; i < 64; i++)
        memset(held[i] = malloc(40 * KiB), 5, 40 * KiB);
    note("{\"threads\": [");
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, STACK);
    for (size_t i = 1; i <= THREADS; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, (void *)(i * 64 * KiB)) != 0)
            return 1;
        while (parked < (int)i)
            usleep(1000);
    }
    char tail[256];
    snprintf(tail, sizeof tail, "],\n \"pool\": [%lu, %lu, %lu],\n \"shm\": [%lu, %lu, %lu]}\n", (unsigned long)pool,
             (unsigned long)POOL, (unsigned long)POOL_TOUCHED, (unsigned long)shm, (unsigned long)SHM,
             (unsigned long)SHM_TOUCHED);
    note(tail);
    char path[4096];
    snprintf(path, sizeof path, "%s/ledger.json", argv[1]);
    int out = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || write(out, ledger, used) != (ssize_t)used)
        return 1;
    close(out);
    kill(getpid(), SIGSTOP);
    for (;;)
        pause();
}
