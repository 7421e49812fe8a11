/*
 * The bytes of byte-level BPE: GPT-2's map between the 256 bytes and the
 * printable characters vocabulary files spell them with, and UTF-8 repair
 * (each maximal invalid subsequence one U+FFFD, as Python's and Rust's
 * lossy decoders replace). See bpe.h and bpe_impl.h.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe_impl.h"

#define xrealloc bpe_xrealloc

/* ---- bytes and characters ------------------------------------------------------ */

static uint32_t byte_char[256]; /* byte -> character */
static int16_t char_byte[324];  /* character -> byte, -1: none */
static pthread_once_t made = PTHREAD_ONCE_INIT;

/* GPT-2's table: printable Latin-1 bytes are themselves, the other 68 bytes
 * are U+0100 onwards in byte order. */
static void make_tables(void)
{
    uint32_t next = 256;
    for (int i = 0; i < 324; i++) char_byte[i] = -1;
    for (int i = 0; i < 256; i++) {
        byte_char[i] =
            (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE) ? (uint32_t)i : next++;
        char_byte[byte_char[i]] = (int16_t)i;
    }
}

uint32_t bpe_byte_char(uint8_t b)
{
    pthread_once(&made, make_tables);
    return byte_char[b];
}

int bpe_char_byte(uint32_t c)
{
    pthread_once(&made, make_tables);
    return c < 324 ? char_byte[c] : -1;
}

/* A multi-byte sequence's lead byte b: its length, and the range its
 * second byte must fall in (Unicode's table 3-7); 0 when b leads none. */
static size_t utf8_lead(unsigned char b, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80, *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        *lo = b == 0xE0 ? 0xA0 : 0x80, *hi = b == 0xED ? 0x9F : 0xBF;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        *lo = b == 0xF0 ? 0x90 : 0x80, *hi = b == 0xF4 ? 0x8F : 0xBF;
        return 4;
    }
    return 0;
}

size_t bpe_utf8_valid_len(const unsigned char *s, size_t n, uint32_t *cp)
{
    const unsigned char b = s[0];
    if (b < 0x80) return *cp = b, 1;
    unsigned char lo, hi;
    const size_t len = utf8_lead(b, &lo, &hi);
    if (!len || n < 2 || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (i >= n || (s[i] & 0xC0) != 0x80) return 0;
    uint32_t c = b & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t i = 1; i < len; i++) c = c << 6 | (s[i] & 0x3F);
    *cp = c;
    return len;
}

/* How many bytes of an invalid sequence at s one U+FFFD replaces: the
 * longest prefix of a well-formed sequence (at least 1), as Python and Rust
 * replace. */
static size_t utf8_invalid_len(const unsigned char *s, size_t n)
{
    unsigned char lo, hi;
    const size_t len = utf8_lead(s[0], &lo, &hi);
    if (!len || n < 2 || s[1] < lo || s[1] > hi) return 1;
    size_t i = 2;
    while (i < len && i < n && (s[i] & 0xC0) == 0x80) i++;
    return i;
}

static void put_cp(char *out, size_t *k, uint32_t c)
{
    if (c < 0x80) {
        out[(*k)++] = (char)c;
    } else if (c < 0x800) {
        out[(*k)++] = (char)(0xC0 | c >> 6);
        out[(*k)++] = (char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        out[(*k)++] = (char)(0xE0 | c >> 12);
        out[(*k)++] = (char)(0x80 | (c >> 6 & 0x3F));
        out[(*k)++] = (char)(0x80 | (c & 0x3F));
    } else {
        out[(*k)++] = (char)(0xF0 | c >> 18);
        out[(*k)++] = (char)(0x80 | (c >> 12 & 0x3F));
        out[(*k)++] = (char)(0x80 | (c >> 6 & 0x3F));
        out[(*k)++] = (char)(0x80 | (c & 0x3F));
    }
}

char *loom_utf8_repair(const char *text, size_t n, size_t *out_n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = bpe_utf8_valid_len(s + i, n - i, &cp);
        if (!l) break;
        i += l;
    }
    if (i == n) return NULL;
    char *out = xrealloc(NULL, 3 * n + 1); /* each byte at most one U+FFFD */
    memcpy(out, text, i);
    size_t k = i;
    while (i < n) {
        size_t l = bpe_utf8_valid_len(s + i, n - i, &cp);
        if (l) {
            memcpy(out + k, s + i, l);
            k += l, i += l;
        } else {
            put_cp(out, &k, 0xFFFD);
            i += utf8_invalid_len(s + i, n - i);
        }
    }
    out[k] = 0;
    *out_n = k;
    return out;
}

char *bpe_name_bytes(const char *name, uint32_t *n)
{
    const size_t len = strlen(name);
    char *out = xrealloc(NULL, len + 1);
    size_t k = 0, i = 0;
    uint32_t cp;
    while (i < len) {
        size_t l = bpe_utf8_valid_len((const unsigned char *)name + i, len - i, &cp);
        int b = l ? bpe_char_byte(cp) : -1;
        if (b < 0) { /* not byte-level: the string's own bytes, as `tokenizers` decodes */
            memcpy(out, name, len);
            k = len;
            break;
        }
        out[k++] = (char)b;
        i += l;
    }
    out[k] = 0;
    *n = (uint32_t)k;
    return out;
}

char *bpe_bytes_name(const char *b, size_t n)
{
    char *out = xrealloc(NULL, 4 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) put_cp(out, &k, bpe_byte_char((uint8_t)b[i]));
    out[k] = 0;
    return out;
}
