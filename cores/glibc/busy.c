/* busy: a multi-threaded service on loopback that keeps account of everything a debugger's stop could
 * disturb, for the test that capturing it again and again harms nothing (tests/live/test_busy.py).
 *
 * Usage: busy DIR.  It listens on 127.0.0.1 (an ephemeral port, written to DIR/port), and serves with
 * WORKERS threads that each take a connection and answer its requests: a request is 8 bytes (a count), the
 * answer 8 bytes (a checksum of that many malloc'd blocks of random sizes, freed again, so the heap churns).
 * Beside them, one thread each waits in a loop for a fixed time with nanosleep, poll, epoll_wait and
 * pthread_cond_timedwait, and counts a wait that ends before its time (cut short), the longest wait past it
 * (late), and epoll_wait's returns with EINTR (it is restarted with the time left, as a service should).
 * Real-time signal SIGRTMIN+1 is counted.  It also maps 64 MiB of shared memory and touches 1 MiB of it.
 * On SIGUSR2 it writes DIR/account: "signals N\n" and, per waiting thread, "KIND waits W short S late_us L
 * eintr E\n"; then DIR/state "N" (the number of SIGUSR2 so far).  DIR/state "0" says it is ready.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WORKERS 6
#define WAIT_NS (20 * 1000000LL)

static const char *dir;
static int listener;
static atomic_long signals_seen;
static atomic_int report_requests;

struct waiter {
    const char *kind;
    atomic_long waits, cut_short, late_ns, eintr;
};
static struct waiter waiters[4] = {{.kind = "nanosleep"}, {.kind = "poll"}, {.kind = "epoll_wait"},
                                   {.kind = "cond_timedwait"}};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void account(struct waiter *w, long long started)
{
    long long waited = now_ns() - started;
    atomic_fetch_add(&w->waits, 1);
    if (waited < WAIT_NS)
        atomic_fetch_add(&w->cut_short, 1);
    long long late = waited - WAIT_NS, seen = atomic_load(&w->late_ns);
    while (late > seen && !atomic_compare_exchange_weak(&w->late_ns, &seen, late))
        ;
}

static void *sleeper(void *arg)
{
    (void)arg;
    for (;;) {
        long long t = now_ns();
        struct timespec ts = {0, WAIT_NS};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            atomic_fetch_add(&waiters[0].eintr, 1);
        account(&waiters[0], t);
    }
    return NULL;
}

static void *poller(void *arg)
{
    (void)arg;
    for (;;) {
        long long t = now_ns();
        int left;
        while ((left = (int)((t + WAIT_NS - now_ns() + 999999) / 1000000)) > 0) {
            if (poll(NULL, 0, left) < 0 && errno == EINTR)
                atomic_fetch_add(&waiters[1].eintr, 1);
        }
        account(&waiters[1], t);
    }
    return NULL;
}

static void *epoller(void *arg)
{
    (void)arg;
    int ep = epoll_create1(0);
    struct epoll_event ev;
    for (;;) {
        long long t = now_ns();
        int left;
        while ((left = (int)((t + WAIT_NS - now_ns() + 999999) / 1000000)) > 0) {
            if (epoll_wait(ep, &ev, 1, left) < 0 && errno == EINTR)
                atomic_fetch_add(&waiters[2].eintr, 1);
        }
        account(&waiters[2], t);
    }
    return NULL;
}

static void *cond_waiter(void *arg)
{
    (void)arg;
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_condattr_t attr;
    pthread_cond_t c;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c, &attr);
    pthread_mutex_lock(&m);
    for (;;) {
        long long t = now_ns(), end = t + WAIT_NS;
        struct timespec deadline = {end / 1000000000LL, end % 1000000000LL};
        while (pthread_cond_timedwait(&c, &m, &deadline) != ETIMEDOUT)
            ;
        account(&waiters[3], t);
    }
    return NULL;
}

static int full_io(int fd, void *buf, size_t n, int writing)
{
    size_t done = 0;
    while (done < n) {
        ssize_t got = writing ? write(fd, (char *)buf + done, n - done) : read(fd, (char *)buf + done, n - done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        done += (size_t)got;
    }
    return 0;
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0)
            continue;
        uint64_t count;
        while (full_io(fd, &count, sizeof count, 0) == 0) {
            uint64_t sum = 0;
            void *blocks[256];
            size_t n = count < 256 ? count : 256;
            for (size_t i = 0; i < n; i++) {
                size_t size = 16 + (size_t)(rand_r(&seed) % 4000);
                blocks[i] = malloc(size);
                memset(blocks[i], (int)i, size);
                sum += size;
            }
            for (size_t i = 0; i < n; i++)
                free(blocks[i]);
            if (full_io(fd, &sum, sizeof sum, 1) != 0)
                break;
        }
        close(fd);
    }
    return NULL;
}

static void on_signal(int sig)
{
    (void)sig;
    atomic_fetch_add(&signals_seen, 1);
}

static void on_report(int sig)
{
    (void)sig;
    atomic_fetch_add(&report_requests, 1);
}

static void write_file(const char *name, const char *text)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        perror("busy: output");
        exit(1);
    }
    close(fd);
    rename(tmp, path);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: busy DIR\n");
        return 2;
    }
    dir = argv[1];
    char *shared = mmap(NULL, 64 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return 1;
    memset(shared, 1, 1 << 20);
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigaction(SIGRTMIN + 1, &sa, NULL);
    sa.sa_handler = on_report;
    sigaction(SIGUSR2, &sa, NULL);
    /* SIGUSR2 blocked in every thread (they inherit it) and in the main thread but inside sigsuspend: it is
     * always the main thread's, and never lost between its check of the requests and its wait */
    sigset_t usr2, unblocked;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &usr2, &unblocked);

    listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 64) != 0 ||
        getsockname(listener, (struct sockaddr *)&addr, &len) != 0) {
        perror("busy: listen");
        return 1;
    }
    pthread_t t;
    for (int i = 0; i < WORKERS; i++)
        pthread_create(&t, NULL, worker, (void *)(uintptr_t)(i + 1));
    void *(*waiting[4])(void *) = {sleeper, poller, epoller, cond_waiter};
    for (int i = 0; i < 4; i++)
        pthread_create(&t, NULL, waiting[i], NULL);

    char text[1024];
    snprintf(text, sizeof text, "%d\n", ntohs(addr.sin_port));
    write_file("port", text);
    write_file("state", "0\n");
    int answered = 0;
    for (;;) {
        sigsuspend(&unblocked);
        while (answered < atomic_load(&report_requests)) {
            answered++;
            int n = snprintf(text, sizeof text, "signals %ld\n", atomic_load(&signals_seen));
            for (int i = 0; i < 4; i++)
                n += snprintf(text + n, sizeof text - (size_t)n, "%s waits %ld short %ld late_us %ld eintr %ld\n",
                              waiters[i].kind, atomic_load(&waiters[i].waits), atomic_load(&waiters[i].cut_short),
                              atomic_load(&waiters[i].late_ns) / 1000, atomic_load(&waiters[i].eintr));
            write_file("account", text);
            snprintf(text, sizeof text, "%d\n", answered);
            write_file("state", text);
        }
    }
}
