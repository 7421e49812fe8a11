/*
 * The C face of libsentencepiece (spm_lib.cc), for spm.c alone. Built only
 * where the library is (LOOM_HAVE_SPM).
 */
#ifndef LOOM_TOKENIZER_SPM_LIB_H
#define LOOM_TOKENIZER_SPM_LIB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct spm_lib;
enum { SPM_LIB_BOS, SPM_LIB_EOS, SPM_LIB_UNK, SPM_LIB_PAD };
enum { SPM_LIB_NORMAL, SPM_LIB_BYTE, SPM_LIB_CONTROL, SPM_LIB_UNKNOWN, SPM_LIB_UNUSED };

/* A model from a serialized ModelProto (a tokenizer.model file's bytes);
 * NULL with the library's message in err. */
struct spm_lib *spm_lib_load(const char *bytes, size_t n, char *err, size_t cap);
void spm_lib_free(struct spm_lib *m);
int32_t spm_lib_size(const struct spm_lib *m);
/* SPM_LIB_BOS...: the id, -1 when the model has none. */
int32_t spm_lib_special(const struct spm_lib *m, int which);
/* The piece's text (the model's own, with U+2581 for spaces). */
const char *spm_lib_piece(const struct spm_lib *m, int32_t id, size_t *len);
int spm_lib_kind(const struct spm_lib *m, int32_t id);
/* The ids of text (malloc'ed into *ids); -1 on failure. Thread-safe. */
int spm_lib_encode(const struct spm_lib *m, const char *text, size_t n, int32_t **ids, size_t *n_ids);
/* The text of ids (malloc'ed, NUL-terminated), NULL on failure. */
char *spm_lib_decode(const struct spm_lib *m, const int32_t *ids, size_t n, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
