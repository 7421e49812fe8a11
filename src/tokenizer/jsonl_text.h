/*
 * The string under one key of a JSON object, decoded whole, NULs
 * included. cJSON ends a decoded string at its first \u0000 escape, so a
 * document holding one would lose everything after it; prepare.c takes
 * such a document's text from here instead. The line must be JSON that
 * cJSON has accepted: nothing is validated here.
 */
#ifndef LOOM_TOKENIZER_JSONL_TEXT_H
#define LOOM_TOKENIZER_JSONL_TEXT_H

#include <stddef.h>

/* The decoded string value of the first top-level `key` of the object in
 * line[0, n): a buffer to free() in *out, its length in *len (the buffer
 * NUL-terminated past it). Returns 0, or -1 when the key is absent or its
 * value is not a string. */
int loom_jsonl_text(const char *line, size_t n, const char *key, char **out, size_t *len);

#endif
