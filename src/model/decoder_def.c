/*
 * What a decoder family's registry entry computes from its definition
 * (decoder_def.h): the spec, the checks, the shape as files record it.
 */
#include "model/decoder_def.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "config/config.h" /* loom_moe_layers_parse */
#include "model/decoder_family.h"
#include "model/family.h"
#include "model/hf_decoder.h"
#include "model/sparsity.h"

struct loom_config loom_decoder_def_resolve(const struct loom_decoder_def *d, const struct loom_config *cfg)
{
    struct loom_config c = *cfg;
    if (!c.group_query_attention || !c.num_query_groups) c.num_query_groups = c.num_attention_heads;
    if (!c.kv_channels && c.num_attention_heads > 0) c.kv_channels = c.hidden_size / c.num_attention_heads;
    if (!c.ffn_hidden_size)
        c.ffn_hidden_size =
            d->arch->mlp == LOOM_MLP_GATED ? (int)(4.0 * c.hidden_size * 2 / 3 / 64) * 64 : 4 * c.hidden_size;
    if (!c.num_experts) /* a dense model has no MoE shape */
        c.moe_router_topk = 2, c.moe_ffn_hidden_size = c.moe_shared_expert_intermediate_size = 0,
        c.moe_router_pre_softmax = 0, snprintf(c.moe_layer_freq, sizeof c.moe_layer_freq, "1");
    else if (!c.moe_ffn_hidden_size)
        c.moe_ffn_hidden_size = c.ffn_hidden_size;
    if (c.embedding_dropout < 0) c.embedding_dropout = c.hidden_dropout; /* unset: the hidden one */
    return c;
}

/* --moe-layer-freq read, every layer's MLP dense... where the text is
 * not one (loom_decoder_def_check says so). */
static void moe_layers_of(const char *text, struct loom_moe_layers *m)
{
    if (loom_moe_layers_parse(text, m) != LOOM_OK) *m = (struct loom_moe_layers){.freq = 1};
}

struct loom_decoder_spec loom_decoder_def_spec(const struct loom_decoder_def *d,
                                               const struct loom_config *cfg)
{
    const struct loom_config c = loom_decoder_def_resolve(d, cfg);
    struct loom_decoder_spec s = *d->arch;
    s.family = d->family;
    s.name = d->family->name;
    for (int k = 0; k < d->nkeys; k++) {
        const void *from = (const char *)&c + d->keys[k].cfg;
        void *to = (char *)&s + d->keys[k].spec;
        if (d->keys[k].kind == LOOM_SHAPE_REAL)
            *(double *)to = *(const double *)from;
        else if (d->keys[k].kind == LOOM_SHAPE_LAYERS)
            moe_layers_of(from, to);
        else
            *(int *)to = *(const int *)from;
    }
    if (c.init_method_std > 0) s.init_std = c.init_method_std; /* Megatron's --init-method-std */
    s.balance = c.moe_router_load_balancing_type;
    s.aux_coeff = s.balance != LOOM_MOE_BALANCE_NONE ? c.moe_aux_loss_coeff : 0;
    s.z_coeff = c.moe_z_loss_coeff;
    s.capacity_factor = c.moe_expert_capacity_factor;
    s.drop_policy = c.moe_token_drop_policy;
    s.pad_to_capacity = c.moe_pad_expert_input_to_capacity;
    if (d->finish) d->finish(&s);
    return s;
}

static int has_key(const struct loom_decoder_def *d, size_t cfg_offset)
{
    for (int k = 0; k < d->nkeys; k++)
        if (d->keys[k].cfg == cfg_offset) return 1;
    return 0;
}

static const char *mlp_name(const struct loom_decoder_spec *a)
{
    return a->mlp == LOOM_MLP_DENSE         ? "a dense MLP"
           : a->activation == LOOM_MLP_SILU ? "a SwiGLU MLP"
                                            : "a GeGLU MLP";
}

/* Megatron's settings for the family's architecture; another value is another model. */
static int check_architecture(const struct loom_decoder_def *d, const struct loom_config *cfg)
{
    const struct loom_decoder_spec *a = d->arch;
    const char *title = d->family->title, *norms[] = {"LayerNorm", "RMSNorm"},
               *positions[] = {"learned_absolute", "rope"};
    const int swiglu = a->mlp == LOOM_MLP_GATED && a->activation == LOOM_MLP_SILU;
    if (cfg->kv_channels && !has_key(d, offsetof(struct loom_config, kv_channels)) &&
        cfg->kv_channels * cfg->num_attention_heads != cfg->hidden_size)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--kv-channels %d: a %s head is --hidden-size / --num-attention-heads wide",
                              cfg->kv_channels, title);
    if (cfg->normalization != a->norm)
        return loom_error_set(LOOM_ERR_INPUT, "--normalization %s: %s models use %s",
                              norms[cfg->normalization], title, norms[a->norm]);
    if (cfg->position_embedding_type != a->positions)
        return loom_error_set(LOOM_ERR_INPUT, "--position-embedding-type %s: %s models use %s",
                              positions[cfg->position_embedding_type], title, positions[a->positions]);
    if (cfg->swiglu != swiglu)
        return loom_error_set(LOOM_ERR_INPUT, "--swiglu %s: %s models use %s", cfg->swiglu ? "on" : "off",
                              title, mlp_name(a));
    if (cfg->disable_bias_linear != !(a->o_bias || a->mlp_bias))
        return loom_error_set(LOOM_ERR_INPUT, "--disable-bias-linear %s: %s models have %s",
                              cfg->disable_bias_linear ? "on" : "off", title,
                              a->o_bias     ? "biases"
                              : a->qkv_bias ? "no biases but q, k and v's"
                                            : "no biases");
    if (cfg->add_qkv_bias != (a->qkv_bias && !a->o_bias))
        return loom_error_set(LOOM_ERR_INPUT, "--add-qkv-bias %s: %s models have %s",
                              cfg->add_qkv_bias ? "on" : "off", title,
                              a->qkv_bias ? "biases on q, k and v" : "no biases on q, k and v");
    if (cfg->num_query_groups && !cfg->group_query_attention)
        return loom_error_set(LOOM_ERR_INPUT, "--num-query-groups %d needs --group-query-attention",
                              cfg->num_query_groups);
    /* what a family's table does not have is the one value its models have */
    if (cfg->group_query_attention && !has_key(d, offsetof(struct loom_config, num_query_groups)))
        return loom_error_set(LOOM_ERR_INPUT,
                              "--group-query-attention: %s models have a key/value head per head", title);
    const int ffn = loom_decoder_def_spec(d, cfg).ffn;
    if (cfg->ffn_hidden_size && cfg->ffn_hidden_size != ffn &&
        !has_key(d, offsetof(struct loom_config, ffn_hidden_size)))
        return loom_error_set(LOOM_ERR_INPUT, "--ffn-hidden-size %d: a %s MLP is %d wide",
                              cfg->ffn_hidden_size, title, ffn);
    if (loom_config_given(cfg, "--rotary-base") && !has_key(d, offsetof(struct loom_config, rotary_base)))
        return loom_error_set(LOOM_ERR_INPUT, "--rotary-base: %s models have no rotary embedding", title);
    if (cfg->activation_function != LOOM_ACTIVATION_GELU_NEW &&
        !has_key(d, offsetof(struct loom_config, activation_function)) &&
        loom_config_given(cfg, "--activation-function"))
        return loom_error_set(LOOM_ERR_INPUT, "--activation-function is GPT-2's: %s's MLP is %s", title,
                              mlp_name(a) + 2);
    return LOOM_OK;
}

static void set_architecture(const struct loom_decoder_def *d, struct loom_config *cfg)
{
    const struct loom_decoder_spec *a = d->arch;
    cfg->normalization = a->norm;
    cfg->position_embedding_type = a->positions;
    cfg->swiglu = a->mlp == LOOM_MLP_GATED && a->activation == LOOM_MLP_SILU;
    cfg->disable_bias_linear = !(a->o_bias || a->mlp_bias);
    cfg->add_qkv_bias = a->qkv_bias && !a->o_bias;
    cfg->group_query_attention = has_key(d, offsetof(struct loom_config, num_query_groups));
}

/* The sizes a spec can be built with for sequences of T. */
static int check_spec(const struct loom_decoder_spec *s, int T)
{
    if (s->num_layers < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--num-layers must be >= 1, got %d", s->num_layers);
    if (s->heads < 1 || s->hidden < 1 || (!s->head_dim && s->hidden % s->heads))
        return loom_error_set(LOOM_ERR_INPUT, "--hidden-size %d is not divisible by --num-attention-heads %d",
                              s->hidden, s->heads);
    const int hs = s->head_dim ? s->head_dim : s->hidden / s->heads;
    if (s->positions == LOOM_POSITION_ROPE && hs % 2)
        return loom_error_set(LOOM_ERR_INPUT, "the head size %d must be even for the rotary embedding", hs);
    if (s->kv_heads < 1 || s->heads % s->kv_heads)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--num-query-groups %d does not divide --num-attention-heads %d", s->kv_heads,
                              s->heads);
    if (s->ffn < 1) return loom_error_set(LOOM_ERR_INPUT, "--ffn-hidden-size must be >= 1, got %d", s->ffn);
    if (s->vocab < 2) return loom_error_set(LOOM_ERR_INPUT, "--vocab-size must be >= 2, got %d", s->vocab);
    if (T > s->max_pos)
        return loom_error_set(LOOM_ERR_INPUT, "--seq-length %d exceeds --max-position-embeddings %d", T,
                              s->max_pos);
    if (s->positions == LOOM_POSITION_ROPE && !(s->rope_theta > 0))
        return loom_error_set(LOOM_ERR_INPUT, "--rotary-base must be positive, got %g", s->rope_theta);
    return LOOM_OK;
}

/* A mixture of experts' settings, and what it runs with so far: one
 * process or data parallelism (ZeRO too) and pipelines, float32,
 * recomputation. */
static int check_moe(const struct loom_decoder_def *d, const struct loom_config *cfg,
                     const struct loom_decoder_spec *s)
{
    const char *why = NULL;
    if (!s->experts && d->hf && loom_hf_key_of(d->hf, "num_experts"))
        return loom_error_set(LOOM_ERR_INPUT, "--num-experts 0: %s models are mixtures of experts",
                              d->family->title);
    if (!s->experts) {
        static const char *const moe_flags[] = {"--moe-router-topk",
                                                "--moe-ffn-hidden-size",
                                                "--moe-shared-expert-intermediate-size",
                                                "--moe-layer-freq",
                                                "--moe-router-pre-softmax",
                                                "--moe-aux-loss-coeff",
                                                "--moe-z-loss-coeff",
                                                "--expert-model-parallel-size",
                                                "--moe-expert-capacity-factor",
                                                "--moe-token-drop-policy",
                                                "--moe-pad-expert-input-to-capacity"};
        for (size_t i = 0; i < sizeof moe_flags / sizeof moe_flags[0]; i++)
            if (loom_config_given(cfg, moe_flags[i]))
                return loom_error_set(LOOM_ERR_INPUT, "%s needs --num-experts (the model has no experts)",
                                      moe_flags[i]);
        return LOOM_OK;
    }
    if (!s->names->router)
        return loom_error_set(LOOM_ERR_INPUT, "--num-experts: %s models have no mixture-of-experts form",
                              d->family->title);
    if (s->topk > s->experts)
        return loom_error_set(LOOM_ERR_INPUT, "--moe-router-topk %d exceeds --num-experts %d", s->topk,
                              s->experts);
    if (s->moe_ffn < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--moe-ffn-hidden-size must be >= 1, got %d", s->moe_ffn);
    const struct loom_moe_layers *ml = &s->moe_layers;
    if (!ml->freq && (int)strlen(ml->list) != s->num_layers)
        return loom_error_set(LOOM_ERR_INPUT, "--moe-layer-freq '%s' gives %d layers; the model has %d",
                              cfg->moe_layer_freq, (int)strlen(ml->list), s->num_layers);
    if (loom_decoder_moe_count(s) < s->num_layers && !s->names->up)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--moe-layer-freq %s: %s models have experts in every layer (no dense MLP)",
                              cfg->moe_layer_freq, d->family->title);
    if (s->shared_ffn && !s->names->shared)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--moe-shared-expert-intermediate-size %d: %s models have no shared experts",
                              s->shared_ffn, d->family->title);
    if (loom_config_given(cfg, "--moe-expert-capacity-factor") && !(s->capacity_factor > 0))
        return loom_error_set(LOOM_ERR_INPUT,
                              "--moe-expert-capacity-factor %g: each expert's capacity must be at least one "
                              "token (a factor above 0; leave it out for dropless routing)",
                              s->capacity_factor);
    if (s->pad_to_capacity && !(s->capacity_factor > 0))
        return loom_error_set(LOOM_ERR_INPUT,
                              "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
    if (loom_config_given(cfg, "--moe-token-drop-policy") && !(s->capacity_factor > 0))
        return loom_error_set(LOOM_ERR_INPUT,
                              "--moe-token-drop-policy needs --moe-expert-capacity-factor (dropless routing "
                              "drops nothing)");
    if (s->balance == LOOM_MOE_HF_AUX_LOSS && cfg->pipeline_model_parallel_size > 1)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--moe-router-load-balancing-type hf_aux_loss with "
                              "--pipeline-model-parallel-size %d: its one loss over every layer's router "
                              "is not summed across stages yet",
                              cfg->pipeline_model_parallel_size);
    const int tp = cfg->tensor_model_parallel_size;
    if (tp > 1 && !cfg->layout_invariant &&
        (s->moe_ffn % tp || s->shared_ffn % tp)) /* whole under the flag */
        return loom_error_set(LOOM_ERR_INPUT,
                              "--tensor-model-parallel-size %d must divide --moe-ffn-hidden-size %d and "
                              "--moe-shared-expert-intermediate-size %d: each rank holds as many of every "
                              "expert's columns",
                              tp, s->moe_ffn, s->shared_ffn);
    if (cfg->context_parallel_size > 1 && s->capacity_factor > 0)
        why = "--context-parallel-size above 1 and --moe-expert-capacity-factor (a capacity is the whole "
              "micro-batch's, whose rows the context ranks split: not built yet)";
    else if (cfg->fp8_format != LOOM_FP8_OFF)
        why = "--fp8-format (the experts' products are not fp8 layers yet)";
    else if (cfg->attention_backend == LOOM_ATTN_BACKEND_UNFUSED ||
             cfg->attention_backend == LOOM_ATTN_BACKEND_LOCAL)
        why = "--attention-backend unfused or local (the MoE layers run with the fused attention)";
    if (why) return loom_error_set(LOOM_ERR_INPUT, "--num-experts %d with %s", s->experts, why);
    return LOOM_OK;
}

/* The tensor-parallel splits and --layout-invariant pieces the shape allows. */
static int check_layout(const struct loom_decoder_def *d, const struct loom_config *cfg,
                        const struct loom_decoder_spec *s)
{
    const int tp = cfg->tensor_model_parallel_size > 1 ? cfg->tensor_model_parallel_size : 1;
    const int mha = !has_key(d, offsetof(struct loom_config, num_query_groups)); /* the heads alone */
    if (mha && s->heads % tp)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d: "
                              "each tensor-parallel rank computes whole heads",
                              s->heads, tp);
    if (s->kv_heads % tp)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--num-query-groups %d is not divisible by --tensor-model-parallel-size %d: each "
            "tensor-parallel rank computes whole key/value groups",
            s->kv_heads, tp);
    if (s->ffn % tp)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--ffn-hidden-size %d is not divisible by --tensor-model-parallel-size %d",
                              s->ffn, tp);
    const int cp = cfg->context_parallel_size > 1 ? cfg->context_parallel_size : 1;
    if (cp > 1 && cfg->cp_comm_type == LOOM_CP_COMM_A2A && (s->heads % (tp * cp) || s->kv_heads % (tp * cp)))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--cp-comm-type a2a gives each of the --context-parallel-size %d ranks whole heads: "
            "--num-attention-heads %d and the key/value groups %d must be divisible by %d "
            "(tensor x context parallel size)",
            cp, s->heads, s->kv_heads, tp * cp);
    const int n = cfg->layout_invariant;
    if (mha && n && s->heads % n) /* the MLP's 4 x C then divides too */
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--num-attention-heads %d is not divisible by --layout-invariant %d: each piece is "
            "whole heads",
            s->heads, n);
    if (n && (s->heads % n || s->kv_heads % n || s->ffn % n))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--layout-invariant %d must divide --num-attention-heads %d, the key/value groups "
            "%d and --ffn-hidden-size %d: each piece is whole heads, groups and columns",
            n, s->heads, s->kv_heads, s->ffn);
    return LOOM_OK;
}

/* The attention sequences of T take: a sliding window that covers them is
 * dense (a model read for its weights, at T = 1, builds no layout). */
static struct loom_config attention_of(const struct loom_decoder_def *d, const struct loom_config *cfg,
                                       const struct loom_decoder_spec *s, int T)
{
    struct loom_config c = *cfg;
    if (c.attention_window >= T) c.attention_window = 0;
    /* the end-of-document token: the family's end of text (the vocabulary's last id for GPT-2) */
    if (c.eod_token_id < 0)
        c.eod_token_id = d->hf && !d->hf->end_of_text_last ? d->hf->eos_token_id : s->vocab - 1;
    return c;
}

int loom_decoder_def_check(const struct loom_decoder_def *d, const struct loom_config *cfg, int T)
{
    struct loom_moe_layers ml; /* a dense model's MLPs: the setting is check_moe's to refuse, if given */
    if (cfg->num_experts > 0 && loom_moe_layers_parse(cfg->moe_layer_freq, &ml)) return LOOM_ERR_INPUT;
    const struct loom_decoder_spec s = loom_decoder_def_spec(d, cfg);
    const struct loom_config c = attention_of(d, cfg, &s, T);
    int rc = check_architecture(d, cfg);
    if (rc == LOOM_OK && (c.reset_position_ids || c.reset_attention_mask || c.eod_mask_loss) &&
        c.eod_token_id >= s.vocab)
        rc = loom_error_set(LOOM_ERR_INPUT, "--eod-token-id %d is outside the vocabulary (%d tokens)",
                            c.eod_token_id, s.vocab);
    if (rc == LOOM_OK) rc = check_spec(&s, T);
    if (rc == LOOM_OK) rc = check_moe(d, cfg, &s);
    if (rc == LOOM_OK) rc = check_layout(d, cfg, &s);
    if (rc == LOOM_OK) rc = loom_model_sparsity_check(&c, s.heads, T);
    return rc;
}

int loom_decoder_def_check_sizes(const struct loom_decoder_def *d, const struct loom_config *cfg, int T)
{
    const struct loom_decoder_spec s = loom_decoder_def_spec(d, cfg);
    return check_spec(&s, T);
}

struct loom_model *loom_decoder_def_create(const struct loom_decoder_def *d, const struct loom_config *cfg,
                                           int B, int T, int training, int tp_rank, int pp_rank)
{
    const struct loom_decoder_spec s = loom_decoder_def_spec(d, cfg);
    const struct loom_config c = attention_of(d, cfg, &s, T);
    return loom_decoder_build(&c, &s, B, T, training, tp_rank, pp_rank);
}

/* The table's setting at spec field offset, or NULL. */
static const struct loom_shape_key *spec_key(const struct loom_decoder_def *d, size_t spec_offset)
{
    for (int k = 0; k < d->nkeys; k++)
        if (d->keys[k].spec == spec_offset) return &d->keys[k];
    return NULL;
}

/* Whether s holds the value a file without setting k had (the family's
 * default); a setting without one has none. */
static int at_default(const struct loom_shape_key *k, const struct loom_decoder_spec *s)
{
    struct loom_shape_setting def;
    memset(&def, 0, sizeof def);
    if (!k->absent || !loom_model_shape_parse(&def, k->absent)) return 0;
    const void *field = (const char *)s + k->spec;
    if (k->kind == LOOM_SHAPE_REAL) return *(const double *)field == def.real;
    if (k->kind == LOOM_SHAPE_WORD) return strcmp(k->words[*(const int *)field], def.word) == 0;
    if (k->kind == LOOM_SHAPE_LAYERS) return ((const struct loom_moe_layers *)field)->freq == def.value;
    return *(const int *)field == def.value;
}

/* What the family's table fixes (GPT-2's key/value heads and MLP width)
 * and the numerics at its defaults go unsaid. */
void loom_decoder_def_describe(const struct loom_model *m, char *buf, size_t n)
{
    const struct loom_decoder_def *d = loom_decoder_def_of(m);
    const struct loom_decoder *dm = loom_decoder_of((struct loom_model *)m);
    const struct loom_decoder_spec *s = &dm->spec;
    const struct loom_shape_key *eps = spec_key(d, offsetof(struct loom_decoder_spec, norm_eps)),
                                *act = spec_key(d, offsetof(struct loom_decoder_spec, activation));
    size_t l =
        (size_t)snprintf(buf, n, "%d layers, %d channels, %d heads", s->num_layers, s->hidden, s->heads);
    if (spec_key(d, offsetof(struct loom_decoder_spec, kv_heads)) && l < n)
        l += (size_t)snprintf(buf + l, n - l, " (%d key/value", s->kv_heads);
    if (s->head_dim && l < n) l += (size_t)snprintf(buf + l, n - l, ", head size %d", s->head_dim);
    if (spec_key(d, offsetof(struct loom_decoder_spec, kv_heads)) && l < n)
        l += (size_t)snprintf(buf + l, n - l, ")");
    if (spec_key(d, offsetof(struct loom_decoder_spec, ffn)) && l < n)
        l += (size_t)snprintf(buf + l, n - l, ", MLP %d", s->ffn);
    if (l < n)
        l += (size_t)snprintf(buf + l, n - l, ", T=%d, V=%d", dm->ctx.T, s->vocab); /* the whole sequence */
    if (s->positions == LOOM_POSITION_ROPE && l < n)
        l += (size_t)snprintf(buf + l, n - l, ", rope %g", s->rope_theta);
    if (eps && !at_default(eps, s) && l < n)
        l += (size_t)snprintf(buf + l, n - l, ", %s eps %g",
                              s->norm == LOOM_NORM_RMSNORM ? "RMSNorm" : "LayerNorm", s->norm_eps);
    if (act && !at_default(act, s) && l < n)
        l += (size_t)snprintf(buf + l, n - l, ", %s", act->words[s->activation]);
    if (s->untied && l < n) l += (size_t)snprintf(buf + l, n - l, ", untied LM head");
    if (s->experts && l < n)
        l += (size_t)snprintf(buf + l, n - l, ", %d experts of %d (top %d)", s->experts, s->moe_ffn, s->topk);
    if (s->experts && s->moe_layers.freq > 1 && l < n)
        l += (size_t)snprintf(buf + l, n - l, " in every %d layers", s->moe_layers.freq);
    else if (s->experts && !s->moe_layers.freq && l < n)
        l += (size_t)snprintf(buf + l, n - l, " in %d of the layers", loom_decoder_moe_count(s));
    if (s->shared_ffn && l < n) snprintf(buf + l, n - l, ", shared experts of %d", s->shared_ffn);
    loom_model_sparsity_describe(dm->sparse, buf, n);
}

/* A setting from the configuration's field (cfg) or the spec's. */
static void add(struct loom_model_shape *out, const struct loom_shape_key *k, const void *base, size_t offset,
                int cfg)
{
    const void *field = (const char *)base + offset;
    if (k->kind == LOOM_SHAPE_LAYERS) { /* an integer, or a list expression (a word) */
        struct loom_moe_layers m;
        if (cfg) moe_layers_of(field, &m);
        const struct loom_moe_layers *from = cfg ? &m : field;
        char text[LOOM_MOE_FREQ_TEXT];
        loom_moe_layers_text(from, text, sizeof text);
        if (from->freq)
            loom_model_shape_add_int(out, k->key, from->freq);
        else
            loom_model_shape_add_word(out, k->key, text);
    } else if (k->kind == LOOM_SHAPE_INT)
        loom_model_shape_add_int(out, k->key, *(const int *)field);
    else if (k->kind == LOOM_SHAPE_REAL)
        loom_model_shape_add_real(out, k->key, *(const double *)field);
    else
        loom_model_shape_add_word(out, k->key, k->words[*(const int *)field]);
}

/* Whether key k goes unsaid: quiet, in a dense model. */
static int quiet_default(const struct loom_shape_key *k, int experts)
{
    return (k->quiet == 1 || k->quiet == 2) && experts == 0;
}

void loom_decoder_def_shape_of(const struct loom_decoder_def *d, const struct loom_config *cfg,
                               struct loom_model_shape *out)
{
    const struct loom_config c =
        loom_decoder_def_resolve(d, cfg); /* the derived values, as the model has them */
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "%s", d->family->name);
    for (int k = 0; k < d->nkeys; k++) add(out, &d->keys[k], &c, d->keys[k].cfg, 1);
}

void loom_decoder_def_model_shape(const struct loom_decoder_def *d, const struct loom_decoder *m,
                                  struct loom_model_shape *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "%s", d->family->name);
    for (int k = 0; k < d->nkeys; k++)
        if (!quiet_default(&d->keys[k], m->spec.experts)) add(out, &d->keys[k], &m->spec, d->keys[k].spec, 0);
}

/* One setting into its configuration field; LOOM_ERR_INPUT naming it when
 * out of range. */
static int apply_key(const struct loom_shape_key *key, const struct loom_shape_setting *kv,
                     struct loom_config *cfg)
{
    void *field = (char *)cfg + key->cfg;
    if (key->kind == LOOM_SHAPE_LAYERS) {
        char text[LOOM_MOE_FREQ_TEXT];
        struct loom_moe_layers m;
        loom_model_shape_text(kv, text, sizeof text);
        if (kv->kind == LOOM_SHAPE_REAL || loom_moe_layers_parse(text, &m))
            return loom_error_set(LOOM_ERR_INPUT,
                                  "model.%s: expected an integer or a list expression of 0 and 1 (%s)",
                                  key->key, text);
        snprintf(field, LOOM_MOE_FREQ_TEXT, "%s", text);
    } else if (key->kind == LOOM_SHAPE_INT) {
        if (kv->kind != LOOM_SHAPE_INT || kv->value < key->lo || kv->value > key->hi)
            return loom_error_set(LOOM_ERR_INPUT, "model.%s: expected an integer in [%.0f, %.0f]", key->key,
                                  key->lo, key->hi);
        *(int *)field = (int)kv->value;
    } else if (key->kind == LOOM_SHAPE_REAL) {
        if (kv->kind == LOOM_SHAPE_WORD || !(kv->real >= key->lo && kv->real <= key->hi))
            return loom_error_set(LOOM_ERR_INPUT, "model.%s: expected a number in [%.0f, %.0f]", key->key,
                                  key->lo, key->hi);
        *(double *)field = kv->real;
    } else {
        int w = 0;
        while (key->words[w] && !(kv->kind == LOOM_SHAPE_WORD && strcmp(kv->word, key->words[w]) == 0)) w++;
        if (!key->words[w]) {
            char names[128] = "";
            for (int i = 0; key->words[i]; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                         !i                  ? ""
                         : key->words[i + 1] ? ", "
                                             : " or ",
                         key->words[i]);
            return loom_error_set(LOOM_ERR_INPUT, "model.%s: expected %s", key->key, names);
        }
        *(int *)field = w;
    }
    return LOOM_OK;
}

int loom_decoder_def_apply_shape(const struct loom_decoder_def *d, const struct loom_model_shape *shape,
                                 struct loom_config *cfg)
{
    const char *title = d->family->title;
    if (strcmp(shape->type, d->family->name) != 0)
        return loom_error_set(LOOM_ERR_INPUT, "the file holds a %s model, not %s", shape->type, title);
    for (int i = 0; i < shape->n; i++) {
        int k = 0;
        while (k < d->nkeys && strcmp(shape->kv[i].key, d->keys[k].key) != 0) k++;
        if (k == d->nkeys)
            return loom_error_set(LOOM_ERR_INPUT, "model.%s: not a %s shape setting", shape->kv[i].key,
                                  title);
    }
    struct loom_config out = *cfg; /* all or nothing */
    for (int k = 0; k < d->nkeys; k++) {
        const struct loom_shape_key *key = &d->keys[k];
        const struct loom_shape_setting *kv = loom_model_shape_find(shape, key->key);
        struct loom_shape_setting absent;
        if (!kv && !key->absent) return loom_error_set(LOOM_ERR_INPUT, "model.%s: missing", key->key);
        if (!kv) { /* an older file: the value every model had then */
            memset(&absent, 0, sizeof absent);
            loom_model_shape_parse(&absent, key->absent);
            kv = &absent;
        }
        int rc = apply_key(key, kv, &out);
        if (rc) return rc;
    }
    set_architecture(d, &out); /* the architecture the file's model has */
    *cfg = out;
    return LOOM_OK;
}

int loom_decoder_def_flag_wins(const struct loom_decoder_def *d, const char *key)
{
    for (int k = 0; d && k < d->nkeys; k++)
        if (strcmp(d->keys[k].key, key) == 0) return d->keys[k].quiet >= 2;
    return 0;
}

const struct loom_decoder_def *loom_decoder_def_of(const struct loom_model *m)
{
    const struct loom_model_family *f = m ? loom_model_family_of(m) : NULL;
    return f ? f->decoder : NULL;
}
