/*
 * `loom sample`: continue a prompt with saved weights. Temperature and top-k
 * sampling from the model's last-position logits, the context window sliding
 * over the last T tokens, with a model of the --model preset's family. The
 * prompt is encoded and the output decoded by the tokenizer: --tokenizer, or
 * the one the checkpoint holds (saved there by `loom train --tokenizer`),
 * or a Hugging Face directory's (loom convert copies it there);
 * without one, byte by byte (the byte-level vocabulary, ids below 256).
 * Output is printed as it comes, holding back the bytes of a character
 * that later tokens complete. Not here: a KV cache (each token reruns the
 * window).
 */
#include "app/sample.h"

#include "kernels/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "engine/checkpoint.h"
#include "io/checkpoint.h"
#include "model/family.h"
#include "tokenizer/tokenizer.h"

static int pick(const float *logits, int V, double temperature, int top_k, struct loom_rng *rng)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    float kth = -INFINITY; /* logits below the k-th largest are excluded */
    if (top_k > 0 && top_k < V) {
        float *sorted = loom_alloc(loom_mul_size((size_t)V, sizeof(float)), LOOM_MEM_OTHER);
        memcpy(sorted, logits, sizeof(float) * (size_t)V);
        /* partial selection: k passes are fine for the sizes sampled here */
        for (int k = 0; k < top_k; k++) {
            int mi = k;
            for (int i = k + 1; i < V; i++)
                if (sorted[i] > sorted[mi]) mi = i;
            float t = sorted[k];
            sorted[k] = sorted[mi];
            sorted[mi] = t;
        }
        kth = sorted[top_k - 1];
        loom_free(sorted);
    }
    double sum = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] >= kth) sum += exp((logits[i] - logits[best]) / temperature);
    double u = loom_rng_uniform(rng) * sum, acc = 0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (logits[i] < kth) continue;
        acc += exp((logits[i] - logits[best]) / temperature);
        last = i;
        if (acc > u) return i;
    }
    return last;
}

/* The tokenizer: --tokenizer, else the one that comes with the weights
 * (a checkpoint's tokenizer.json, a Hugging Face directory's); *t NULL
 * when there is none. */
static int find_tokenizer(const struct loom_config *cfg, struct loom_tokenizer **t)
{
    *t = NULL;
    char path[4400] = "";
    if (*cfg->tokenizer) {
        snprintf(path, sizeof path, "%s", cfg->tokenizer);
    } else {
        int rc =
            loom_weights_find_tokenizer(cfg->load, path, sizeof path); /* a checkpoint's held to its record */
        if (rc) return rc;
    }
    if (!*path) return LOOM_OK;
    int rc = loom_tokenizer_load(path, *cfg->tokenizer ? cfg->merge_file : NULL, t);
    if (rc == LOOM_OK && loom_tokenizer_vocab_size(*t) > cfg->vocab_size) {
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "tokenizer %s has %d token ids, more than the model's vocabulary of %d", path,
                            loom_tokenizer_vocab_size(*t), cfg->vocab_size);
        loom_tokenizer_free(*t);
        *t = NULL;
    }
    return rc;
}

/* Prints the bytes of pending[0, *n) that form whole characters (U+FFFD for
 * what can never be one), keeping an unfinished character's bytes; all of
 * them when final. */
static void print_text(char *pending, size_t *n, int final)
{
    size_t k = *n;
    if (!final) /* an unfinished sequence at the end: up to 3 bytes after its lead byte */
        for (size_t back = 1; back <= 3 && back <= k; back++) {
            const unsigned char c = (unsigned char)pending[k - back];
            if ((c & 0xC0) == 0x80) continue;
            const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            if (need > back) k -= back;
            break;
        }
    size_t fixed_n;
    char *fixed = loom_utf8_repair(pending, k, &fixed_n);
    fwrite(fixed ? fixed : pending, 1, fixed ? fixed_n : k, stdout);
    free(fixed);
    memmove(pending, pending + k, *n - k);
    *n -= k;
}

int loom_sample(struct loom_config *cfg)
{
    if (!*cfg->load)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loom sample needs --load DIR (a checkpoint) or FILE.safetensors");
    if (cfg->tensor_model_parallel_size > 1 || cfg->sequence_parallel)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loom sample runs in one process (any checkpoint loads there): "
                              "--tensor-model-parallel-size %d%s is for training",
                              cfg->tensor_model_parallel_size,
                              cfg->sequence_parallel ? " --sequence-parallel" : "");
    if (cfg->pipeline_model_parallel_size > 1)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loom sample runs in one process (any checkpoint loads there): "
                              "--pipeline-model-parallel-size %d is for training",
                              cfg->pipeline_model_parallel_size);
    if (cfg->context_parallel_size > 1)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loom sample runs in one process (any checkpoint loads there): "
                              "--context-parallel-size %d is for training",
                              cfg->context_parallel_size);
    if (cfg->expert_model_parallel_size > 1)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loom sample runs in one process (any checkpoint loads there): "
                              "--expert-model-parallel-size %d is for training",
                              cfg->expert_model_parallel_size);
    const struct loom_model_family *family = loom_model_family_of_preset(cfg->model, NULL);
    if (!family)
        return loom_error_set(LOOM_ERR_INPUT, "--model %s: no model family has this preset", cfg->model);
    int T = cfg->seq_length, rc;
    if ((rc = family->check(cfg, T))) return rc;
    const struct loom_backend *be = loom_backend_default();
    if (be->setup && (rc = be->setup(cfg->threads, LOOM_DTYPE_F32, NULL))) return rc;
    struct loom_model *m = family->create(cfg, 1, T, 0, 0, 0);
    loom_model_alloc_arenas(m, 1, LOOM_MODEL_PARAM_ARENA);
    if ((rc = loom_checkpoint_load_weights(m, cfg->load))) {
        family->destroy(m);
        return rc;
    }
    struct loom_tokenizer *tok;
    if ((rc = find_tokenizer(cfg, &tok))) {
        family->destroy(m);
        return rc;
    }
    if (!tok && cfg->vocab_size > 256 && *cfg->prompt)
        loom_log_warn(
            "no tokenizer (--tokenizer, or one in the checkpoint): the prompt is encoded byte by byte");
    size_t plen = strlen(cfg->prompt);
    struct loom_ids prompt = {0};
    if (tok) { /* as `transformers` encodes a prompt: the template's beginning (Llama's <s>), then the text */
        int32_t pre[4], post[4];
        int n_pre, n_post;
        loom_tokenizer_template(tok, pre, &n_pre, post, &n_post);
        for (int i = 0; i < n_pre; i++) loom_ids_push(&prompt, pre[i]);
        struct loom_tokenizer_state *st = loom_tokenizer_state_new(tok);
        loom_tokenizer_encode(tok, st, cfg->prompt, plen, &prompt);
        loom_tokenizer_state_free(st);
    } else {
        for (size_t i = 0; i < plen; i++)
            loom_ids_push(&prompt, (unsigned char)cfg->prompt[i] % cfg->vocab_size);
    }
    size_t total = prompt.n + (size_t)cfg->max_new_tokens;
    int32_t *toks = loom_alloc(sizeof(int32_t) * (total + 1), LOOM_MEM_OTHER);
    int32_t *window = loom_alloc(sizeof(int32_t) * (size_t)T, LOOM_MEM_OTHER);
    float *row =
        loom_alloc(sizeof(float) * (size_t)cfg->vocab_size, LOOM_MEM_OTHER); /* one position's logits */
    if (prompt.n) memcpy(toks, prompt.ids, prompt.n * sizeof *toks);
    size_t n = prompt.n;
    loom_ids_free(&prompt);
    if (n == 0)
        toks[n++] = tok && loom_tokenizer_eot(tok) >= 0 ? loom_tokenizer_eot(tok)
                                                        : 0; /* an empty prompt: from end of text */
    size_t npending = 0, pending_cap = 4096;
    char *pending = loom_alloc(pending_cap, LOOM_MEM_OTHER);
    struct loom_rng rng;
    loom_rng_seed(&rng, (uint64_t)cfg->seed);
    fwrite(cfg->prompt, 1, plen, stdout);
    const struct loom_lm_batch batch = {window, NULL}; /* logits only */
    for (int k = 0; k < cfg->max_new_tokens && rc == LOOM_OK; k++) {
        size_t start = n > (size_t)T ? n - (size_t)T : 0;
        int len = (int)(n - start);
        memset(window, 0, sizeof(int32_t) * (size_t)T);
        memcpy(window, toks + start, sizeof(int32_t) * (size_t)len);
        loom_model_eval(m, &batch, 1);
        const float *logits = loom_model_logits(m);
        if (!logits) {
            rc = loom_error_set(LOOM_ERR_INPUT, "loom sample: a %s model gives no logits", family->title);
            break;
        }
        m->backend->download(row, logits + (size_t)(len - 1) * cfg->vocab_size,
                             sizeof(float) * (size_t)cfg->vocab_size);
        int next = pick(row, cfg->vocab_size, cfg->temperature, cfg->top_k, &rng);
        toks[n++] = next;
        size_t blen;
        const char *b = tok ? loom_tokenizer_token_bytes(tok, next, &blen) : NULL;
        if (tok && b) {
            if (npending + blen > pending_cap) {
                pending_cap = 2 * (npending + blen);
                pending = loom_realloc(pending, pending_cap, LOOM_MEM_OTHER);
            }
            memcpy(pending + npending, b, blen);
            npending += blen;
            print_text(pending, &npending, 0);
        } else if (tok) {
            printf("<%d>", next);
        } else if (cfg->vocab_size <= 256) {
            unsigned char c = (unsigned char)next;
            if (c == '\n' || c == '\t' || (c >= 32 && c < 127))
                putchar(c);
            else
                printf("\\x%02x", c);
        } else {
            printf("<%d>", next);
        }
        fflush(stdout);
    }
    print_text(pending, &npending, 1);
    putchar('\n');
    loom_free(pending);
    loom_tokenizer_free(tok);
    loom_free(toks);
    loom_free(window);
    loom_free(row);
    family->destroy(m);
    return rc;
}
