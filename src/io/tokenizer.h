/*
 * The byte-level tokenizer: vocabulary of 256, token = byte. Text becomes a
 * train shard and a validation shard (`loom data tokenize IN OUTDIR`), and
 * tokens become printable text again for showing samples.
 *
 * Not here (yet): GPT-2's BPE (encoder.json + vocab.bpe), which will sit
 * beside this one behind the same two entry points.
 */
#ifndef LOOM_IO_TOKENIZER_H
#define LOOM_IO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_BYTE_VOCAB 256

/* Reads the file `in` and writes OUTDIR/train.bin (the first bytes) and
 * OUTDIR/val.bin (the last round(n * val_fraction) bytes), creating OUTDIR
 * when missing, and prints one line with both counts. val_fraction in
 * [0, 1); the train part must not be empty. LOOM_ERR_INPUT names the file
 * or value at fault; LOOM_ERR_RUNTIME a failed write. */
int loom_data_tokenize(const char *in, const char *outdir, double val_fraction);

/* Writes tokens as text into out (capacity cap, always NUL-terminated when
 * cap > 0) and returns the length the whole text needs, like snprintf.
 * Printable ASCII, newline, tab and well-formed UTF-8 sequences pass through;
 * a backslash is written "\\"; every other byte as "\xHH"; an id outside the
 * byte vocabulary as "<id>". */
size_t loom_byte_decode(const int32_t *tokens, int64_t n, char *out, size_t cap);

#endif
