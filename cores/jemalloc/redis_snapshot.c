/* A Redis module for tests/cores/jemalloc/test_redis.py: the command HEAPWALK.SNAPSHOT PATH writes jemalloc's statistics
 * (je_malloc_stats_print(..., "J"), what MEMORY MALLOC-STATS prints, as JSON) into PATH and stops the whole
 * process with SIGSTOP, from the main thread, before replying: the core taken then holds the state the
 * statistics describe.  Run it with jemalloc's background threads off (CONFIG SET jemalloc-bg-thread no),
 * so that no thread of the allocator's runs between the two.  Everything is written with write(2).
 *
 * As cores/jemalloc/je_common.h does for the reproducers: the statistics are printed twice and the second kept (the
 * first sets up what the printer allocates once), and with jemalloc 5.3 (Redis 7.2 and later), whose printer
 * writes through a 64 KiB buffer it takes from arena 0 and frees, the same buffer is taken again (mallocx, no
 * thread cache), so that arena 0's pages are as printed. */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "redismodule.h"

void je_malloc_stats_print(void (*write_cb)(void *, const char *), void *opaque, const char *opts);
int je_mallctl(const char *name, void *old, size_t *oldlen, void *new_value, size_t newlen);
void *je_mallocx(size_t size, int flags);

#define STATS_BUFFER 65536                       /* jemalloc 5.3's STATS_PRINT_BUFSIZE */
#define ARENA_0_NO_TCACHE ((1 << 20) | (1 << 8)) /* MALLOCX_ARENA(0) | MALLOCX_TCACHE_NONE */

/* whether this jemalloc prints through a buffer of its own: 5.3 and later, unless built with --enable-debug */
static int prints_through_a_buffer(void) {
    const char *version = NULL;
    size_t len = sizeof version;
    _Bool debug = 0;
    size_t dlen = sizeof debug;
    if (je_mallctl("version", &version, &len, NULL, 0) != 0 || je_mallctl("config.debug", &debug, &dlen, NULL, 0))
        return -1;
    return !debug && (version[0] > '5' || (version[0] == '5' && version[2] >= '3'));
}

static void write_all(void *opaque, const char *text) {
    int fd = (int)(long)opaque;
    size_t n = strlen(text);
    while (n) {
        ssize_t w = write(fd, text, n);
        if (w <= 0)
            return;
        text += w;
        n -= (size_t)w;
    }
}

static int snapshot(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    static char path[4096];
    size_t len;
    if (argc != 2)
        return RedisModule_WrongArity(ctx);
    const char *given = RedisModule_StringPtrLen(argv[1], &len);
    if (len >= sizeof path)
        return RedisModule_ReplyWithError(ctx, "ERR path too long");
    memcpy(path, given, len);
    path[len] = '\0';
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return RedisModule_ReplyWithError(ctx, "ERR cannot open the file");
    int buffered = prints_through_a_buffer();
    if (buffered < 0)
        return RedisModule_ReplyWithError(ctx, "ERR mallctl failed");
    je_malloc_stats_print(write_all, (void *)(long)fd, "J");
    if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0)
        return RedisModule_ReplyWithError(ctx, "ERR cannot rewrite the file");
    je_malloc_stats_print(write_all, (void *)(long)fd, "J");
    close(fd);
    if (buffered && je_mallocx(STATS_BUFFER, ARENA_0_NO_TCACHE) == NULL)
        return RedisModule_ReplyWithError(ctx, "ERR mallocx of the statistics buffer failed");
    kill(getpid(), SIGSTOP);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "heapwalk", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return RedisModule_CreateCommand(ctx, "heapwalk.snapshot", snapshot, "", 0, 0, 0);
}
