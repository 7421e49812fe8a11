/*
 * libFuzzer target for the token-shard reader (io/shard.h): each input is
 * written to a file and opened as a shard (llm.c's format: a 256-int32
 * header with magic, version and token count, then uint16 tokens), with a
 * vocabulary of 50257 and of 256. A rejected file must give LOOM_ERR_INPUT
 * (or LOOM_ERR_RUNTIME for the system's own failures) on one line naming
 * the file, and leave the shard empty; an accepted one must hold exactly
 * the tokens its header counts, every one inside the vocabulary. A broken
 * promise aborts, which libFuzzer reports with the input.
 *
 * fuzz-sources: src/io/shard.c src/io/fs.c src/base/log.c src/base/mem.c
 * fuzz-libs:
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/shard.h"
#include "loom/loom.h"

#define REQUIRE(cond)                                                                                        \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "fuzz_shard: broken promise at line %d: %s\n", __LINE__, #cond);                 \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "fuzz-shard-%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(data, 1, size, f) == size);
    REQUIRE(fclose(f) == 0);
    const int vocabs[2] = {50257, 256};
    for (int v = 0; v < 2; v++) {
        struct loom_shard s;
        int rc = loom_shard_open(&s, path, vocabs[v]);
        if (rc != LOOM_OK) {
            const char *msg = loom_error_message();
            REQUIRE(rc == LOOM_ERR_INPUT || rc == LOOM_ERR_RUNTIME);
            REQUIRE(msg[0] && !strchr(msg, '\n') && strstr(msg, path));
            REQUIRE(s.tokens == NULL && s.tokens32 == NULL && s.n == 0);
            continue;
        }
        int32_t count, version;
        REQUIRE(size >= LOOM_SHARD_HEADER_BYTES);
        memcpy(&version, data + 4, sizeof version);
        memcpy(&count, data + 8, sizeof count);
        const size_t width = version == LOOM_SHARD_VERSION_32 ? 4 : 2;
        REQUIRE(s.n == count && size == (size_t)LOOM_SHARD_HEADER_BYTES + width * (size_t)count);
        REQUIRE(width == 4 ? s.tokens32 && !s.tokens : s.tokens && !s.tokens32);
        for (int64_t i = 0; i < s.n; i++) REQUIRE(loom_shard_token(&s, i) < (uint32_t)vocabs[v]);
        REQUIRE(memcmp(width == 4 ? (const void *)s.tokens32 : (const void *)s.tokens,
                       data + LOOM_SHARD_HEADER_BYTES, width * (size_t)s.n) == 0);
        loom_shard_close(&s);
    }
    unlink(path);
    return 0;
}
