/*
 * Token shards in llm.c's format: a header of 256 little-endian int32
 * (magic 20240520, version, token count, the rest zero) followed by the
 * tokens: version 1 as uint16 (GPT-2's), version 2 as uint32 (llm.c's
 * Llama 3 shards, for vocabularies past 65,536 ids). Data prepared for
 * llm.c works unchanged.
 *
 * A shard is opened read-only through mmap and validated once at open: the
 * header, the file size against the token count, and (given a vocabulary
 * size) every token id, so training never meets a bad id. The writer is
 * crash-safe (temporary name, fsync, rename, directory fsync).
 *
 * Two small file helpers that the data layer's writers share live here too:
 * crash-safe writing of any buffer, and creating an output directory.
 *
 * Not here: which windows of a shard feed which step (sampler.h), turning
 * text into tokens (tokenizer.h).
 */
#ifndef LOOM_IO_SHARD_H
#define LOOM_IO_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_SHARD_MAGIC 20240520
#define LOOM_SHARD_VERSION 1    /* uint16 tokens */
#define LOOM_SHARD_VERSION_32 2 /* uint32 tokens */
#define LOOM_SHARD_HEADER_INTS 256
#define LOOM_SHARD_HEADER_BYTES (LOOM_SHARD_HEADER_INTS * 4)
/* The header stores the count as int32. */
#define LOOM_SHARD_MAX_TOKENS INT32_MAX

struct loom_shard {
    char *path;               /* owned copy, for messages */
    const uint16_t *tokens;   /* (n) into the mapping: version 1's */
    const uint32_t *tokens32; /* version 2's (the other NULL) */
    int64_t n;                /* token count */
    void *map;                /* the whole file, read-only */
    size_t map_bytes;
};

/* Token i of an open shard. */
static inline uint32_t loom_shard_token(const struct loom_shard *s, int64_t i)
{
    return s->tokens32 ? s->tokens32[i] : s->tokens[i];
}

/* Maps and validates `path`. With vocab > 0 every token must be < vocab;
 * vocab <= 0 skips that check. Returns LOOM_OK, or LOOM_ERR_INPUT with a
 * message naming the file and what is wrong with it. */
int loom_shard_open(struct loom_shard *s, const char *path, int vocab);
/* Safe on a zeroed or already closed shard. */
void loom_shard_close(struct loom_shard *s);

/* Writes `n` tokens as a shard at `path`, crash-safely. LOOM_ERR_INPUT when
 * n exceeds LOOM_SHARD_MAX_TOKENS, LOOM_ERR_RUNTIME when a system call fails
 * (the message names the call and the path). */
int loom_shard_write(const char *path, const uint16_t *tokens, int64_t n);
/* The same for ids past 16 bits: a version 2 shard of uint32 tokens. */
int loom_shard_write32(const char *path, const uint32_t *tokens, int64_t n);

#endif
