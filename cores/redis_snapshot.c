/* A Redis module for tests/test_redis.py: the command HEAPWALK.SNAPSHOT PATH writes jemalloc's statistics
 * (je_malloc_stats_print(..., "J"), what MEMORY MALLOC-STATS prints, as JSON) into PATH and stops the whole
 * process with SIGSTOP, from the main thread, before replying: the core taken then holds the state the
 * statistics describe.  Run it with jemalloc's background threads off (CONFIG SET jemalloc-bg-thread no),
 * so that no thread of the allocator's runs between the two.  Everything is written with write(2). */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "redismodule.h"

void je_malloc_stats_print(void (*write_cb)(void *, const char *), void *opaque, const char *opts);

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
    je_malloc_stats_print(write_all, (void *)(long)fd, "J");
    close(fd);
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
