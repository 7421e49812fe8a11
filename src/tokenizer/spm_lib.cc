/*
 * The one C++ file: Debian's libsentencepiece behind a C interface (the
 * library has none). Only spm.c calls these; nothing here knows loom.
 */
#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "tokenizer/spm_lib.h"

struct spm_lib {
    sentencepiece::SentencePieceProcessor sp;
};

static void set_error(char *err, size_t cap, const std::string &msg)
{
    if (cap) {
        std::strncpy(err, msg.c_str(), cap - 1);
        err[cap - 1] = 0;
    }
}

extern "C" struct spm_lib *spm_lib_load(const char *bytes, size_t n, char *err, size_t cap)
{
    spm_lib *m = new (std::nothrow) spm_lib;
    if (!m) {
        set_error(err, cap, "out of memory");
        return nullptr;
    }
    try {
        const auto st = m->sp.LoadFromSerializedProto(std::string(bytes, n));
        if (!st.ok()) {
            set_error(err, cap, st.ToString());
            delete m;
            return nullptr;
        }
    } catch (const std::exception &e) {
        set_error(err, cap, e.what());
        delete m;
        return nullptr;
    }
    return m;
}

extern "C" void spm_lib_free(struct spm_lib *m)
{
    delete m;
}

extern "C" int32_t spm_lib_size(const struct spm_lib *m)
{
    return m->sp.GetPieceSize();
}

extern "C" int32_t spm_lib_special(const struct spm_lib *m, int which)
{
    switch (which) {
    case SPM_LIB_BOS:
        return m->sp.bos_id();
    case SPM_LIB_EOS:
        return m->sp.eos_id();
    case SPM_LIB_UNK:
        return m->sp.unk_id();
    default:
        return m->sp.pad_id();
    }
}

extern "C" const char *spm_lib_piece(const struct spm_lib *m, int32_t id, size_t *len)
{
    const std::string &p = m->sp.IdToPiece(id);
    *len = p.size();
    return p.data();
}

extern "C" int spm_lib_kind(const struct spm_lib *m, int32_t id)
{
    if (m->sp.IsByte(id)) return SPM_LIB_BYTE;
    if (m->sp.IsControl(id)) return SPM_LIB_CONTROL;
    if (m->sp.IsUnknown(id)) return SPM_LIB_UNKNOWN;
    if (m->sp.IsUnused(id)) return SPM_LIB_UNUSED;
    return SPM_LIB_NORMAL;
}

extern "C" int spm_lib_encode(const struct spm_lib *m, const char *text, size_t n, int32_t **ids,
                              size_t *n_ids)
{
    std::vector<int> v;
    try {
        if (!m->sp.Encode(absl::string_view(text, n), &v).ok()) return -1;
    } catch (const std::exception &) {
        return -1;
    }
    *ids = static_cast<int32_t *>(std::malloc((v.size() ? v.size() : 1) * sizeof **ids));
    if (!*ids) return -1;
    for (size_t i = 0; i < v.size(); i++) (*ids)[i] = v[i];
    *n_ids = v.size();
    return 0;
}

extern "C" char *spm_lib_decode(const struct spm_lib *m, const int32_t *ids, size_t n, size_t *len)
{
    std::string out;
    try {
        std::vector<int> v(ids, ids + n);
        if (!m->sp.Decode(v, &out).ok()) return nullptr;
    } catch (const std::exception &) {
        return nullptr;
    }
    char *s = static_cast<char *>(std::malloc(out.size() + 1));
    if (!s) return nullptr;
    std::memcpy(s, out.data(), out.size());
    s[out.size()] = 0;
    *len = out.size();
    return s;
}
