/*
 * `loom sample`: continue a prompt with saved weights. Temperature and top-k
 * sampling from the model's last-position logits, the context window sliding
 * over the last T tokens, with a model of the --model preset's family. The
 * byte-level tokenizer decodes (a BPE vocabulary comes with its tokenizer).
 * Not here: a KV cache (each token reruns the window).
 */
#include "app/sample.h"

#include <math.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "engine/checkpoint.h"
#include "kernels/kernels.h"
#include "model/family.h"

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

int loom_sample(struct loom_config *cfg)
{
    if (!*cfg->load)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loom sample needs --load DIR (a checkpoint) or FILE.safetensors");
    if (cfg->vocab_size > 256 && *cfg->prompt)
        loom_log_warn("the prompt is encoded byte by byte (no BPE tokenizer is built in yet)");
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
    const struct loom_model_family *family = loom_model_family_of_preset(cfg->model, NULL);
    if (!family)
        return loom_error_set(LOOM_ERR_INPUT, "--model %s: no model family has this preset", cfg->model);
    int T = cfg->seq_length, rc;
    if ((rc = family->check(cfg, T))) return rc;
    if (cfg->threads > 0) loom_threads_set(cfg->threads);
    struct loom_model *m = family->create(cfg, 1, T, 0, 0, 0);
    loom_model_alloc_arenas(m, 1, LOOM_MODEL_PARAM_ARENA);
    if ((rc = loom_checkpoint_load_weights(m, cfg->load))) {
        family->destroy(m);
        return rc;
    }
    size_t plen = strlen(cfg->prompt);
    size_t total = plen + (size_t)cfg->max_new_tokens;
    int32_t *toks = loom_alloc(sizeof(int32_t) * (total + 1), LOOM_MEM_OTHER);
    int32_t *window = loom_alloc(sizeof(int32_t) * (size_t)T, LOOM_MEM_OTHER);
    for (size_t i = 0; i < plen; i++) toks[i] = (unsigned char)cfg->prompt[i] % cfg->vocab_size;
    size_t n = plen;
    if (n == 0) toks[n++] = 0; /* an empty prompt starts from token 0 */
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
        int next = pick(logits + (size_t)(len - 1) * cfg->vocab_size, cfg->vocab_size, cfg->temperature,
                        cfg->top_k, &rng);
        toks[n++] = next;
        if (cfg->vocab_size <= 256) {
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
    putchar('\n');
    loom_free(toks);
    loom_free(window);
    family->destroy(m);
    return rc;
}
