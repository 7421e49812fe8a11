/*
 * `loom convert IN OUT` for a decoder family (model/convert.h): its weights
 * from one format to another.
 *
 *   llmc         llm.c's checkpoint (gpt2_124M.bin; model/llmc.h), for a
 *                family llm.c's layout holds
 *   safetensors  one file under the family's Hugging Face names, with
 *                loom's metadata (model/hf_decoder.h)
 *   hf           a directory with model.safetensors, config.json and
 *                generation_config.json, which transformers loads
 *   checkpoint   (input only) a loom checkpoint: a save directory (its
 *                latest) or one iter_NNNNNNN directory, any layout
 *
 * Every input is read into one model of the family in memory, whole, with
 * the llm.c facts that the model does not hold (header version, padded
 * vocabulary and its rows) alongside; every output is written from that. A
 * new format is one reader or writer in the formats table plus a line in
 * detect_input or detect_output.
 *
 * Not here: writing sharded Hugging Face checkpoints (reading them: source.c),
 * pytorch_model.bin, tokenizer files (the CLI copies a tokenizer.json).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/st_index.h"
#include "model/convert.h"
#include "model/decoder_def.h"
#include "model/family.h"
#include "model/hf_decoder.h"
#include "model/llmc.h"
#include "model/llmc_extra.h"
#include "model/source.h"

enum convert_format {
    CONVERT_LLMC = 0,
    CONVERT_SAFETENSORS = 1,
    CONVERT_HF_DIR = 2,
    CONVERT_CHECKPOINT = 3, /* input only */
    CONVERT_FORMAT_COUNT
};

/* The model between reading and writing. */
struct converted {
    struct loom_model *model;    /* freed with the family's destroy */
    struct loom_llmc_extra llmc; /* all zero unless the weights came from llm.c */
};

struct convert_opts {
    const struct loom_convert_env *env;
    const char *in, *out;
    int to;                  /* enum convert_format; -1 from OUT's name */
    int llmc_version;        /* --dtype; 0: the source's llm.c version, else float32 */
    int heads;               /* --num-attention-heads; 0 from the input */
    int64_t max_shard_bytes; /* --max-shard-size: a Hugging Face directory's shards (default 5 GB) */
};

static int read_llmc(const char *path, const struct convert_opts *o, struct converted *c);
static int read_source(const char *path, const struct convert_opts *o, struct converted *c);
static int read_checkpoint(const char *path, const struct convert_opts *o, struct converted *c);
static int write_llmc(const char *path, const struct convert_opts *o, const struct converted *c);
static int write_safetensors(const char *path, const struct convert_opts *o, const struct converted *c);
static int write_hf_dir(const char *path, const struct convert_opts *o, const struct converted *c);

static const struct {
    const char *name; /* for --to and messages */
    const char *what; /* in the summary line */
    int (*read)(const char *path, const struct convert_opts *o, struct converted *c);
    int (*write)(const char *path, const struct convert_opts *o, const struct converted *c);
} formats[] = {
    [CONVERT_LLMC] = {"llmc", "llm.c checkpoint", read_llmc, write_llmc},
    [CONVERT_SAFETENSORS] = {"safetensors", "safetensors", read_source, write_safetensors},
    [CONVERT_HF_DIR] = {"hf", "Hugging Face directory", read_source, write_hf_dir},
    [CONVERT_CHECKPOINT] = {"checkpoint", "loom checkpoint", read_checkpoint, NULL},
};
_Static_assert(sizeof formats / sizeof formats[0] == CONVERT_FORMAT_COUNT, "one formats row per format");

/* Which families a list names. */
enum family_kind { FAMILIES_ALL = 0, FAMILIES_LLMC = 1, FAMILIES_BY_TENSORS = 2 };

/* The titles of the registered decoder families of a kind (every one;
 * those llm.c's layout holds; those read by bare tensors) as a list: "GPT-2,
 * Llama and Gemma". */
static void family_list(char *buf, size_t n, enum family_kind kind)
{
    const struct loom_model_family *f, *names[32];
    int k = 0;
    for (int i = 0; (f = loom_model_family_at(i)) && k < 32; i++)
        if (f->decoder &&
            (kind != FAMILIES_LLMC || loom_llmc_holds(f->decoder, f->decoder->arch, "") == LOOM_OK) &&
            (kind != FAMILIES_BY_TENSORS || f->decoder->hf->widths))
            names[k++] = f;
    loom_error_clear();
    *buf = 0;
    for (int i = 0; i < k; i++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%s",
                 i == 0      ? ""
                 : i + 1 < k ? ", "
                             : " and ",
                 names[i]->title);
}

static void usage(FILE *f)
{
    char all[256], llmc[256], bare[256];
    family_list(all, sizeof all, FAMILIES_ALL);
    family_list(llmc, sizeof llmc, FAMILIES_LLMC);
    family_list(bare, sizeof bare, FAMILIES_BY_TENSORS);
    fprintf(f,
            "usage: loom convert IN OUT [--to llmc|safetensors|hf] [--dtype float32|bfloat16]\n"
            "                    [--max-shard-size SIZE] [--num-attention-heads N]\n\n"
            "Converts %s weights.\n"
            "IN is a Hugging Face directory (config.json, model.safetensors or its shards),\n"
            "a safetensors file (with loom's metadata or a config.json beside it; %s's also by its tensors\n"
            "alone), an llm.c checkpoint (e.g. gpt2_124M.bin; %s) or a loom checkpoint (a\n"
            "--save directory or one iter_NNNNNNN in it, from any parallel layout). Its kind\n"
            "comes from its contents; its family from config.json's model_type or loom's\n"
            "metadata, else it is %s. OUT's kind comes from --to, else its name:\n"
            "  NAME.bin          llm.c checkpoint (version 3, float32, unless --dtype or the source says)\n"
            "  NAME.safetensors  one safetensors file (with loom's metadata)\n"
            "  DIR               (an existing directory, a name ending in / or without extension)\n"
            "                    Hugging Face directory: model.safetensors + config.json +\n"
            "                    generation_config.json; past --max-shard-size (5GB) the\n"
            "                    weights go in shards with model.safetensors.index.json\n"
            "llm.c -> safetensors -> llm.c gives the same bytes back (padded vocabulary kept).\n\n"
            "  --to FORMAT              force OUT's kind\n"
            "  --dtype float32|bfloat16 llm.c output: version 3 (float32) or 5 (bfloat16)\n"
            "  --max-shard-size SIZE    a Hugging Face directory's shards at most SIZE (5GB, 200MB, 10KiB)\n"
            "  --num-attention-heads N  for a safetensors input that does not say\n",
            all, bare, llmc, loom_model_family_at(0)->title);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A safetensors file starts with a little-endian u64 header length and '{'. */
static int sniff_safetensors(const char *path)
{
    int rc;
    FILE *f = loom_fs_fopen_input(path, NULL, &rc); /* a FIFO is no safetensors file */
    if (!f) {
        loom_error_clear();
        return 0;
    }
    unsigned char b[9];
    int ok = fread(b, 1, sizeof b, f) == sizeof b && b[8] == '{';
    fclose(f);
    return ok;
}

static int detect_input(const char *path, enum convert_format *kind)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return loom_error_set(LOOM_ERR_INPUT, "cannot open %s: %s", path, strerror(errno));
    if (loom_ckpt_is_checkpoint(path))
        *kind = CONVERT_CHECKPOINT;
    else if (S_ISDIR(sb.st_mode))
        *kind = CONVERT_HF_DIR;
    else if (!S_ISREG(sb.st_mode)) /* a FIFO or a device: refused, never opened (it would wait) */
        return loom_error_set(LOOM_ERR_INPUT, "loom convert IN %s: not a regular file", path);
    else if (loom_llmc_sniff(path))
        *kind = CONVERT_LLMC;
    else if (sniff_safetensors(path))
        *kind = CONVERT_SAFETENSORS;
    /* unrecognised contents: the reader its name asks for says what is wrong */
    else if (ends_with(path, ".bin"))
        *kind = CONVERT_LLMC;
    else if (ends_with(path, ".safetensors"))
        *kind = CONVERT_SAFETENSORS;
    else
        return loom_error_set(LOOM_ERR_INPUT, "%s: neither an llm.c checkpoint nor a safetensors file", path);
    return LOOM_OK;
}

static int detect_output(const char *path, enum convert_format *kind)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (ends_with(path, ".bin"))
        *kind = CONVERT_LLMC;
    else if (ends_with(path, ".safetensors"))
        *kind = CONVERT_SAFETENSORS;
    else if (loom_fs_is_dir(path) || !*base || !strchr(base, '.'))
        *kind = CONVERT_HF_DIR;
    else
        return loom_error_set(LOOM_ERR_INPUT,
                              "cannot tell the output format of %s from its name (.bin, "
                              ".safetensors or a directory); give --to llmc|safetensors|hf",
                              path);
    return LOOM_OK;
}

/* ---- readers --------------------------------------------------------- */

/* --num-attention-heads against what the input says. */
static int check_heads(const char *path, const struct convert_opts *o, int heads)
{
    if (o->heads && o->heads != heads)
        return loom_error_set(LOOM_ERR_INPUT, "--num-attention-heads %d disagrees with %s, which says %d",
                              o->heads, path, heads);
    return LOOM_OK;
}

static int read_llmc(const char *path, const struct convert_opts *o, struct converted *c)
{
    struct loom_decoder *m;
    int rc = loom_llmc_read(o->env->family->decoder, path, &m, &c->llmc);
    if (rc) return rc;
    c->model = &m->base;
    return check_heads(path, o, m->spec.heads);
}

/* A weights source (model/source.h: a safetensors file, or a Hugging Face
 * directory), its shape as the source states it; the heads from
 * --num-attention-heads where it does not. */
static int read_source(const char *path, const struct convert_opts *o, struct converted *c)
{
    const struct loom_model_family *f = o->env->family;
    struct loom_model_shape shape;
    int rc = loom_source_shape(f->decoder, path, &shape);
    if (rc) return rc;
    const struct loom_shape_setting *nh = loom_model_shape_find(&shape, "num_attention_heads");
    const struct loom_shape_setting *C = loom_model_shape_find(&shape, "hidden_size");
    if (nh && (rc = check_heads(path, o, (int)nh->value))) return rc;
    if (!nh && !o->heads)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s does not say how many attention heads the model has (hidden size %lld, no "
                              "config.json beside it); give --num-attention-heads N",
                              path, C ? (long long)C->value : 0LL);
    if (!nh) loom_model_shape_add_int(&shape, "num_attention_heads", o->heads);
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if ((rc = f->apply_shape(&shape, &cfg)) || (rc = f->check(&cfg, 1))) {
        char why[300];
        snprintf(why, sizeof why, "%s", loom_error_message());
        return loom_error_set(rc, "%s: %s", path, why);
    }
    char file[4200];
    if ((rc = loom_source_file(path, file, sizeof file))) return rc;
    const struct loom_decoder_spec spec = loom_decoder_def_spec(f->decoder, &cfg);
    struct loom_decoder *m = loom_decoder_create_whole(&spec, 1, 1);
    loom_model_alloc_arenas(&m->base, 1, LOOM_MODEL_PARAM_ARENA);
    if ((rc = loom_source_load(&m->base, path)) ||
        (!loom_st_is_index(file) && (rc = loom_llmc_extra_load(file, m, &c->llmc)))) { /* shards carry none */
        loom_decoder_free(m);
        return rc;
    }
    c->model = &m->base;
    return LOOM_OK;
}

/* The weights of a loom checkpoint: a save directory (its latest, falling
 * back past a damaged one) or one iter_NNNNNNN directory. */
static int read_checkpoint(const char *path, const struct convert_opts *o, struct converted *c)
{
    const struct loom_model_family *want = o->env->family;
    struct loom_model *m;
    int rc = o->env->read_checkpoint(path, &m);
    if (rc) return rc;
    const struct loom_model_family *family = loom_model_family_of(m);
    if (family != want)
        rc = loom_error_set(LOOM_ERR_INPUT, "%s holds a %s model, not %s", path, m->name, want->title);
    else
        rc = check_heads(path, o, loom_decoder_of(m)->spec.heads);
    if (rc == LOOM_OK)
        c->model = m;
    else if (family)
        family->destroy(m);
    return rc;
}

/* ---- writers --------------------------------------------------------- */

/* --dtype, else the source's llm.c version, else float32 */
static int llmc_out_version(const struct convert_opts *o, const struct converted *c)
{
    if (o->llmc_version) return o->llmc_version;
    return c->llmc.version ? c->llmc.version : LOOM_LLMC_VERSION_F32;
}

static int write_llmc(const char *path, const struct convert_opts *o, const struct converted *c)
{
    return loom_llmc_write(path, loom_decoder_of(c->model), &c->llmc, llmc_out_version(o, c));
}

static int write_safetensors(const char *path, const struct convert_opts *o, const struct converted *c)
{
    (void)o;
    return loom_llmc_extra_save(path, c->model, &c->llmc, 0, 0);
}

/* model.safetensors (or its shards and index past --max-shard-size),
 * config.json and generation_config.json, as save_pretrained writes them. */
static int write_hf_dir(const char *path, const struct convert_opts *o, const struct converted *c)
{
    return loom_llmc_extra_save(path, c->model, &c->llmc, 1, o->max_shard_bytes);
}

/* transformers' max_shard_size: bytes, or a number with KB, MB, GB (powers
 * of 1000) or KiB, MiB, GiB (of 1024). */
static int shard_size(const char *v, int64_t *out)
{
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1},     {"B", 1},         {"KB", 1e3},      {"MB", 1e6},
                 {"GB", 1e9}, {"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}};
    char *end;
    const double x = strtod(v, &end);
    for (size_t i = 0; end != v && i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].unit) == 0 && x * units[i].scale >= 1 && x * units[i].scale < 9e18) {
            *out = (int64_t)(x * units[i].scale);
            return LOOM_OK;
        }
    return loom_error_set(LOOM_ERR_INPUT,
                          "--max-shard-size: expected a size such as 5GB, 200MB or 500KiB (at least 1 byte), "
                          "got '%s'",
                          v);
}

/* ---- command --------------------------------------------------------- */

static int parse_args(int argc, char **argv, struct convert_opts *o, int *help)
{
    *o = (struct convert_opts){.env = o->env, .to = -1, .max_shard_bytes = 5000000000LL};
    *help = 0;
    int npos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *help = 1;
            return LOOM_OK;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (npos == 2)
                return loom_error_set(LOOM_ERR_INPUT, "loom convert takes IN and OUT; extra argument '%s'",
                                      a);
            if (npos++ == 0)
                o->in = a;
            else
                o->out = a;
            continue;
        }
        if (i + 1 >= argc)
            return loom_error_set(LOOM_ERR_INPUT, "%s needs a value (see loom convert --help)", a);
        const char *v = argv[++i];
        if (strcmp(a, "--to") == 0) {
            for (int f = 0; f < CONVERT_FORMAT_COUNT; f++)
                if (strcmp(v, formats[f].name) == 0) o->to = f;
            if (o->to < 0)
                return loom_error_set(LOOM_ERR_INPUT, "--to: expected llmc, safetensors or hf, got '%s'", v);
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(v, "float32") == 0 || strcmp(v, "fp32") == 0)
                o->llmc_version = LOOM_LLMC_VERSION_F32;
            else if (strcmp(v, "bfloat16") == 0 || strcmp(v, "bf16") == 0)
                o->llmc_version = LOOM_LLMC_VERSION_BF16;
            else
                return loom_error_set(LOOM_ERR_INPUT, "--dtype: expected float32 or bfloat16, got '%s'", v);
        } else if (strcmp(a, "--max-shard-size") == 0) {
            int rc = shard_size(v, &o->max_shard_bytes);
            if (rc) return rc;
        } else if (strcmp(a, "--num-attention-heads") == 0) {
            char *end;
            long x = strtol(v, &end, 10);
            if (end == v || *end || x < 1 || x > 65536)
                return loom_error_set(LOOM_ERR_INPUT,
                                      "--num-attention-heads: expected an integer in [1, 65536], "
                                      "got '%s'",
                                      v);
            o->heads = (int)x;
        } else {
            return loom_error_set(LOOM_ERR_INPUT,
                                  "unknown flag %s for loom convert (--to, --dtype, "
                                  "--max-shard-size, --num-attention-heads)",
                                  a);
        }
    }
    if (npos != 2) return loom_error_set(LOOM_ERR_INPUT, "usage: loom convert IN OUT [flags] (see --help)");
    return LOOM_OK;
}

static void describe(char *buf, size_t cap, enum convert_format kind, const struct converted *c,
                     int llmc_version)
{
    const struct loom_decoder_spec *s = &loom_decoder_of(c->model)->spec;
    int n = snprintf(buf, cap, "%s, L=%d C=%d NH=%d", formats[kind].what, s->num_layers, s->hidden, s->heads);
    if (s->kv_heads != s->heads && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " G=%d", s->kv_heads);
    if (s->ffn != 4 * s->hidden && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " F=%d", s->ffn);
    if (n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " V=%d maxT=%d", s->vocab, s->max_pos);
    if (kind == CONVERT_LLMC && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " Vp=%d, version %d (%s)",
                 c->llmc.padded_vocab ? c->llmc.padded_vocab
                                      : (s->vocab + LOOM_LLMC_VOCAB_MULTIPLE - 1) / LOOM_LLMC_VOCAB_MULTIPLE *
                                            LOOM_LLMC_VOCAB_MULTIPLE,
                 llmc_version, llmc_version == LOOM_LLMC_VERSION_BF16 ? "bfloat16" : "float32");
}

static int run(int argc, char **argv, const struct loom_convert_env *env)
{
    struct convert_opts o = {.env = env};
    int help;
    int rc = parse_args(argc, argv, &o, &help);
    if (rc) return rc;
    if (help) {
        usage(stdout);
        return LOOM_OK;
    }
    enum convert_format in_kind = CONVERT_LLMC, out_kind = CONVERT_LLMC;
    if ((rc = detect_input(o.in, &in_kind))) return rc;
    if (o.to >= 0)
        out_kind = (enum convert_format)o.to;
    else if ((rc = detect_output(o.out, &out_kind)))
        return rc;
    if (!formats[out_kind].write)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--to %s: a %s is read, not written, by loom convert (loom train --save writes one)",
            formats[out_kind].name, formats[out_kind].what);
    if (o.llmc_version && out_kind != CONVERT_LLMC)
        return loom_error_set(LOOM_ERR_INPUT, "--dtype applies to llm.c output only, and %s is %s output",
                              o.out, formats[out_kind].name);
    const struct loom_decoder_def *d = env->family->decoder;
    if (out_kind == CONVERT_LLMC && (rc = loom_llmc_holds(d, d->arch, o.out))) {
        char why[400];
        snprintf(why, sizeof why, "%s", loom_error_message());
        return loom_error_set(rc, "%s; give a .safetensors file or a directory", why);
    }

    struct converted c = {0};
    if ((rc = formats[in_kind].read(o.in, &o, &c))) return rc;
    if ((rc = formats[out_kind].write(o.out, &o, &c)) == LOOM_OK) {
        char from[160], to[160];
        describe(from, sizeof from, in_kind, &c, c.llmc.version);
        describe(to, sizeof to, out_kind, &c, llmc_out_version(&o, &c));
        printf("converted %s (%s)\n       to %s (%s)\n", o.in, from, o.out, to);
    }
    if (c.model) env->family->destroy(c.model);
    loom_llmc_extra_free(&c.llmc);
    return rc;
}

const struct loom_model_converter loom_decoder_converter = {
    .usage = usage,
    .run = run,
};
