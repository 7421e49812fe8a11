/*
 * `loom data`: the command line of data preparation. `tokenize` without
 * --tokenizer is the byte-level tokenizer (io/tokenizer.h); with it, and
 * `train-tokenizer`, the BPE preparation (tokenizer/prepare.h); `synth`
 * writes the built-in corpus (io/synth.h). Parsing only: every flag is
 * checked here and named when wrong (exit 2).
 */
#include "cli/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/synth.h"
#include "io/tokenizer.h"
#include "loom/loom.h"
#include "tokenizer/prepare.h"

enum { MAX_INPUTS = 4096, MAX_SPECIALS = 64 };

static const char tokenize_usage[] =
    "usage: loom data tokenize --tokenizer TOK IN... OUTDIR [--text-key K] [--blank-line-docs]\n"
    "                          [--shard-size N] [--val-fraction X] [--no-progress]\n"
    "       loom data tokenize --tokenizer TOK --output-format megatron IN... OUTPUT_PREFIX [--append-eod]\n"
    "                          [--json-keys K]   (Megatron's preprocess_data.py: "
    "OUTPUT_PREFIX_K_document.bin/.idx;\n"
    "                          --input IN and --output-prefix P as there)\n"
    "       (for --tokenizer TOK, Megatron's --tokenizer-type GPT2BPETokenizer --vocab-file V --merge-file "
    "M,\n"
    "        or --tokenizer-type HuggingFaceTokenizer|Llama2Tokenizer|SentencePieceTokenizer "
    "--tokenizer-model TOK;\n"
    "        --workers N sets the threads)\n"
    "       loom data tokenize IN.txt OUTDIR [--val-fraction X]      (byte-level, no tokenizer)\n"
    "TOK: a tokenizer.json, a SentencePiece tokenizer.model, or a directory with one of them or GPT-2's\n"
    "vocab.json + merges.txt.\n"
    "IN: .jsonl (one document a line, its --text-key string, default \"text\") or text (one document a "
    "file,\n"
    "or a block between blank lines with --blank-line-docs). In shards each document gets what the\n"
    "tokenizer's template puts around it (Llama's <s> before it), or, without one, the end-of-text token\n"
    "before it; every 1/X-th document goes to val_*.bin (--val-fraction, default 0.01).\n";

static const char train_tokenizer_usage[] =
    "usage: loom data train-tokenizer --vocab-size N IN... OUTDIR [--pattern gpt2|llama3]\n"
    "                          [--special-tokens A,B,...] [--min-frequency N] [--text-key K] "
    "[--blank-line-docs]\n"
    "Learns byte-level BPE merges on the documents (IN as loom data tokenize reads them) and writes\n"
    "OUTDIR/tokenizer.json: GPT-2's pre-tokenization (--pattern gpt2, the default) or Llama 3's; the\n"
    "special tokens take ids 0, 1, ... (the first is the end of text; default <|endoftext|>).\n";

static const char synth_usage[] =
    "usage: loom data synth OUTDIR [--tokens N] [--seed S]\n"
    "Writes the built-in corpus (a synthetic one with a known entropy floor) as\n"
    "OUTDIR/train.bin and val.bin.\n";

static int parse_i64(const char *flag, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < lo || x > hi)
        return loom_error_set(LOOM_ERR_INPUT, "%s: expected an integer in [%lld, %lld], got '%s'", flag, lo,
                              hi, v);
    *out = x;
    return LOOM_OK;
}

static int parse_fraction(const char *v, double *out)
{
    char *end;
    const double f = strtod(v, &end);
    if (end == v || *end || !(f >= 0 && f < 1))
        return loom_error_set(LOOM_ERR_INPUT, "--val-fraction: expected a number in [0, 1), got '%s'", v);
    *out = f;
    return LOOM_OK;
}

/* The flags of tokenize and train-tokenizer; the rest are inputs then OUTDIR. */
struct data_args {
    const char *tokenizer, *pattern, *specials, *format, *output_prefix;
    const char *tokenizer_type, *vocab_file, *merge_file, *tokenizer_model; /* Megatron's names */
    long long vocab_size, min_frequency;
    struct loom_prepare_opts o;
    const char *pos[MAX_INPUTS + 1];
    int npos;
};

static int parse(const char *cmd, int argc, char **argv, struct data_args *a)
{
    int rc;
    a->o = (struct loom_prepare_opts){
        .text_key = "text", .shard_size = 100000000, .val_fraction = -1, .progress = 1};
    a->pattern = "gpt2";
    a->min_frequency = 2;
    const int train = strcmp(cmd, "train-tokenizer") == 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strncmp(f, "--", 2) != 0) {
            if (a->npos > MAX_INPUTS)
                return loom_error_set(LOOM_ERR_INPUT, "more than %d inputs", MAX_INPUTS);
            a->pos[a->npos++] = f;
            continue;
        }
        if (strcmp(f, "--blank-line-docs") == 0) {
            a->o.blank_line_docs = 1;
            continue;
        }
        if (strcmp(f, "--no-progress") == 0) {
            a->o.progress = 0;
            continue;
        }
        if (strcmp(f, "--append-eod") == 0 && !train) {
            a->o.append_eod = 1;
            continue;
        }
        if (i + 1 >= argc) return loom_error_set(LOOM_ERR_INPUT, "%s needs a value", f);
        const char *v = argv[++i];
        long long x = 0;
        rc = LOOM_OK;
        if (strcmp(f, "--text-key") == 0 || (strcmp(f, "--json-keys") == 0 && !train)) {
            a->o.text_key = v; /* Megatron's --json-keys: one key a run here */
        } else if (strcmp(f, "--output-format") == 0 && !train) {
            if (strcmp(v, "megatron") != 0 && strcmp(v, "shards") != 0)
                return loom_error_set(LOOM_ERR_INPUT,
                                      "--output-format: shards (llm.c's, the default) or megatron, got '%s'",
                                      v);
            a->format = v;
        } else if (strcmp(f, "--input") == 0 && !train) {
            if (a->npos > MAX_INPUTS)
                return loom_error_set(LOOM_ERR_INPUT, "more than %d inputs", MAX_INPUTS);
            a->pos[a->npos++] = v;
        } else if (strcmp(f, "--output-prefix") == 0 && !train)
            a->output_prefix = v;
        else if (strcmp(f, "--tokenizer-type") == 0 && !train)
            a->tokenizer_type = v;
        else if (strcmp(f, "--vocab-file") == 0 && !train)
            a->vocab_file = v;
        else if (strcmp(f, "--merge-file") == 0 && !train)
            a->merge_file = v;
        else if (strcmp(f, "--tokenizer-model") == 0 && !train)
            a->tokenizer_model = v;
        else if (strcmp(f, "--workers") == 0 && !train) {
            if (!(rc = parse_i64(f, v, 1, 4096, &x)))
                a->o.threads = (int)x; /* Megatron's processes: threads */
        } else if (strcmp(f, "--val-fraction") == 0 && !train)
            rc = parse_fraction(v, &a->o.val_fraction);
        else if (strcmp(f, "--tokenizer") == 0 && !train)
            a->tokenizer = v;
        else if (strcmp(f, "--shard-size") == 0 && !train) {
            if (!(rc = parse_i64(f, v, 1, 2147483647LL, &x))) a->o.shard_size = x;
        } else if (strcmp(f, "--vocab-size") == 0 && train)
            rc = parse_i64(f, v, 257, 1LL << 30, &a->vocab_size);
        else if (strcmp(f, "--min-frequency") == 0 && train)
            rc = parse_i64(f, v, 1, 1LL << 62, &a->min_frequency);
        else if (strcmp(f, "--pattern") == 0 && train)
            a->pattern = v;
        else if (strcmp(f, "--special-tokens") == 0 && train)
            a->specials = v;
        else
            return loom_error_set(LOOM_ERR_INPUT, "unknown flag %s for loom data %s (loom data --help)", f,
                                  cmd);
        if (rc) return rc;
    }
    if (a->tokenizer_type) { /* Megatron's tokenizer flags onto --tokenizer */
        const int gpt2 = strcmp(a->tokenizer_type, "GPT2BPETokenizer") == 0,
                  llama2 = strcmp(a->tokenizer_type, "Llama2Tokenizer") == 0,
                  hf = strcmp(a->tokenizer_type, "HuggingFaceTokenizer") == 0 || llama2 ||
                       strcmp(a->tokenizer_type, "SentencePieceTokenizer") == 0 ||
                       strcmp(a->tokenizer_type, "GPTSentencePieceTokenizer") == 0;
        if (!gpt2 && !hf)
            return loom_error_set(
                LOOM_ERR_INPUT,
                "--tokenizer-type %s: expected GPT2BPETokenizer (--vocab-file, --merge-file), "
                "HuggingFaceTokenizer, Llama2Tokenizer, SentencePieceTokenizer or "
                "GPTSentencePieceTokenizer (--tokenizer-model)",
                a->tokenizer_type);
        a->o.megatron_bos = llama2; /* Megatron's Llama2Tokenizer puts <s> before each document */
        if (a->tokenizer)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "--tokenizer and --tokenizer-type name the tokenizer twice");
        if (gpt2 && (!a->vocab_file || !a->merge_file))
            return loom_error_set(LOOM_ERR_INPUT,
                                  "--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file");
        if (hf && !a->tokenizer_model)
            return loom_error_set(LOOM_ERR_INPUT, "--tokenizer-type %s needs --tokenizer-model",
                                  a->tokenizer_type);
        a->tokenizer = gpt2 ? a->vocab_file : a->tokenizer_model;
        a->o.merge_file = gpt2 ? a->merge_file : NULL;
    } else if (a->vocab_file || a->merge_file || a->tokenizer_model)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--vocab-file, --merge-file and --tokenizer-model need --tokenizer-type");
    if (a->output_prefix) { /* Megatron's spelling: the output is the last of the positions */
        if (a->npos > MAX_INPUTS) return loom_error_set(LOOM_ERR_INPUT, "more than %d inputs", MAX_INPUTS);
        a->pos[a->npos++] = a->output_prefix;
    }
    if (a->npos < 2)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loom data %s needs inputs and an output directory (loom data --help)", cmd);
    return LOOM_OK;
}

static int cmd_tokenize(int argc, char **argv)
{
    struct data_args a = {0};
    int rc = parse("tokenize", argc, argv, &a);
    if (rc) return rc;
    if (!a.tokenizer) { /* the byte-level tokenizer of old: one file */
        if (a.npos != 2 || a.o.blank_line_docs || strcmp(a.o.text_key, "text") != 0 ||
            a.o.shard_size != 100000000)
            return loom_error_set(
                LOOM_ERR_INPUT,
                "without --tokenizer, loom data tokenize takes one text file and OUTDIR "
                "(byte-level); --text-key, --blank-line-docs and --shard-size need --tokenizer");
        return loom_data_tokenize(a.pos[0], a.pos[1], a.o.val_fraction < 0 ? 0.1 : a.o.val_fraction);
    }
    const int megatron = a.format && strcmp(a.format, "megatron") == 0;
    if (!megatron && (a.o.append_eod || a.output_prefix))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s belongs to --output-format megatron (shards put the end-of-text token "
                              "before every document)",
                              a.o.append_eod ? "--append-eod" : "--output-prefix");
    if (megatron) {
        if (a.o.val_fraction >= 0 || a.o.shard_size != 100000000)
            return loom_error_set(
                LOOM_ERR_INPUT,
                "--output-format megatron writes one dataset: --%s does not apply (the split is "
                "--split at training)",
                a.o.val_fraction >= 0 ? "val-fraction" : "shard-size");
        a.o.megatron = 1;
        return loom_prepare_tokenize_megatron(a.tokenizer, a.pos, a.npos - 1, a.pos[a.npos - 1], &a.o);
    }
    if (a.o.val_fraction < 0) a.o.val_fraction = 0.01;
    return loom_prepare_tokenize(a.tokenizer, a.pos, a.npos - 1, a.pos[a.npos - 1], &a.o);
}

static int cmd_train_tokenizer(int argc, char **argv)
{
    struct data_args a = {0};
    int rc = parse("train-tokenizer", argc, argv, &a);
    if (rc) return rc;
    if (!a.vocab_size)
        return loom_error_set(LOOM_ERR_INPUT, "loom data train-tokenizer needs --vocab-size N");
    /* the special tokens: given, or the pattern's usual end of text */
    char *list = strdup(a.specials                         ? a.specials
                        : strcmp(a.pattern, "llama3") == 0 ? "<|end_of_text|>,<|begin_of_text|>"
                                                           : "<|endoftext|>");
    const char *specials[MAX_SPECIALS];
    int n = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        if (n == MAX_SPECIALS) {
            free(list);
            return loom_error_set(LOOM_ERR_INPUT, "--special-tokens: more than %d", MAX_SPECIALS);
        }
        specials[n++] = tok;
    }
    rc = loom_prepare_train_tokenizer(a.pos, a.npos - 1, a.pos[a.npos - 1], a.vocab_size, a.pattern, specials,
                                      n, a.min_frequency, &a.o);
    free(list);
    return rc;
}

static int cmd_synth(int argc, char **argv)
{
    int rc;
    if (argc < 2 || strncmp(argv[1], "--", 2) == 0)
        return loom_error_set(LOOM_ERR_INPUT, "usage: loom data synth OUTDIR [--tokens N] [--seed S]");
    long long tokens = LOOM_SYNTH_DEFAULT_TOKENS, seed = LOOM_SYNTH_DEFAULT_SEED;
    for (int i = 2; i < argc; i += 2) {
        if (i + 1 >= argc) return loom_error_set(LOOM_ERR_INPUT, "%s needs a value", argv[i]);
        if (strcmp(argv[i], "--tokens") == 0)
            rc = parse_i64("--tokens", argv[i + 1], 1000, 1LL << 40, &tokens);
        else if (strcmp(argv[i], "--seed") == 0)
            rc = parse_i64("--seed", argv[i + 1], 0, 1LL << 62, &seed);
        else
            rc = loom_error_set(LOOM_ERR_INPUT, "unknown flag %s for loom data synth (--tokens, --seed)",
                                argv[i]);
        if (rc) return rc;
    }
    double h;
    if ((rc = loom_data_synth(argv[1], tokens, (uint64_t)seed, &h))) return rc;
    printf("wrote %lld tokens to %s; entropy rate %.6f nats/token\n", tokens, argv[1], h);
    return LOOM_OK;
}

int loom_cli_data(int argc, char **argv)
{
    if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
        FILE *f = argc < 1 ? stderr : stdout;
        fprintf(f, "%s\n%s\n%s", tokenize_usage, train_tokenizer_usage, synth_usage);
        return argc < 1 ? LOOM_ERR_INPUT : LOOM_OK;
    }
    const char *usage = strcmp(argv[0], "tokenize") == 0          ? tokenize_usage
                        : strcmp(argv[0], "train-tokenizer") == 0 ? train_tokenizer_usage
                        : strcmp(argv[0], "synth") == 0           ? synth_usage
                                                                  : NULL;
    for (int i = 1; usage && i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return LOOM_OK;
        }
    if (strcmp(argv[0], "tokenize") == 0) return cmd_tokenize(argc, argv);
    if (strcmp(argv[0], "train-tokenizer") == 0) return cmd_train_tokenizer(argc, argv);
    if (strcmp(argv[0], "synth") == 0) return cmd_synth(argc, argv);
    return loom_error_set(LOOM_ERR_INPUT, "unknown data command '%s' (tokenize, train-tokenizer, synth)",
                          argv[0]);
}
