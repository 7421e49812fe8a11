/*
 * The CPU backend: the table of kernels/backend.h pointing at the free
 * functions of kernels/kernels.h, memory from the accounting allocator
 * (base/mem.h), conversions from base/buf.c. Everything is synchronous.
 * Training in bf16 gets the table with the bf16 matrix products
 * (kernels_for). Deliberately not: kernels of its own (they stay free functions, which the
 * table only names).
 */
#include <string.h>

#include "base/sumsq_exact.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"

static const struct loom_kernels cpu_kernels = {
    .embedding_forward = loom_embedding_forward,
    .embedding_backward = loom_embedding_backward,
    .embedding_vp_forward = loom_embedding_vp_forward,
    .embedding_vp_backward = loom_embedding_vp_backward,
    .layernorm_forward = loom_layernorm_forward,
    .layernorm_backward = loom_layernorm_backward,
    .matmul_forward = loom_matmul_forward,
    .matmul_backward = loom_matmul_backward,
    .bias_backward = loom_bias_backward,
    .lm_head_forward = loom_lm_head_forward,
    .lm_head_backward = loom_lm_head_backward,
    .lm_head_forward_lp = loom_lm_head_forward_lp,
    .lm_head_backward_lp = loom_lm_head_backward_lp,
    .lm_head_lp_scratch = loom_lm_head_lp_scratch,
    .linear_forward = loom_linear_forward,
    .linear_backward = loom_linear_backward,
    .grouped_forward = loom_grouped_forward,
    .grouped_backward = loom_grouped_backward,
    .attention_forward = loom_attention_forward,
    .attention_backward = loom_attention_backward,
    .sparse_attention_forward = loom_sparse_attention_forward,
    .sparse_attention_backward = loom_sparse_attention_backward,
    .flash_attention_forward = loom_flash_attention_forward,
    .flash_attention_backward = loom_flash_attention_backward,
    .flash_attention_merge = loom_flash_attention_merge,
    .gelu_forward = loom_gelu_forward,
    .gelu_backward = loom_gelu_backward,
    .gelu_exact_forward = loom_gelu_exact_forward,
    .gelu_exact_backward = loom_gelu_exact_backward,
    .rmsnorm_forward = loom_rmsnorm_forward,
    .rmsnorm_backward = loom_rmsnorm_backward,
    .rope_forward = loom_rope_forward,
    .rope_backward = loom_rope_backward,
    .rope_forward_at = loom_rope_forward_at,
    .rope_backward_at = loom_rope_backward_at,
    .swiglu_forward = loom_swiglu_forward,
    .swiglu_backward = loom_swiglu_backward,
    .moe_router_forward = loom_moe_router_forward,
    .moe_router_backward = loom_moe_router_backward,
    .moe_permute_forward = loom_moe_permute_forward,
    .moe_permute_backward = loom_moe_permute_backward,
    .moe_unpermute_forward = loom_moe_unpermute_forward,
    .moe_unpermute_backward = loom_moe_unpermute_backward,
    .geglu_forward = loom_geglu_forward,
    .geglu_backward = loom_geglu_backward,
    .residual_forward = loom_residual_forward,
    .residual_backward = loom_residual_backward,
    .crossentropy_forward = loom_crossentropy_forward,
    .crossentropy_backward = loom_crossentropy_backward,
    .crossentropy_vp_max = loom_crossentropy_vp_max,
    .crossentropy_vp_stats = loom_crossentropy_vp_stats,
    .crossentropy_vp_finish = loom_crossentropy_vp_finish,
    .crossentropy_vp_backward = loom_crossentropy_vp_backward,
    .adamw_update = loom_adamw_update,
    .sum_squares = loom_sum_squares,
    .lp_sum_squares = loom_lp_sum_squares,
    .has_nonfinite = loom_has_nonfinite,
    .lp_has_nonfinite = loom_lp_has_nonfinite,
    .sumsq_exact_add = loom_sumsq_exact_add,
    .set_threads = loom_threads_set,
    .scale = loom_scale,
    .dropout_rows = loom_dropout_rows,
    .add_scalar = loom_add_scalar,
    .accumulate = loom_accumulate,
    .round_to = loom_round_to,
    .round_store = loom_round_store,
    .lp_accumulate = loom_lp_accumulate,
    .gqa_pack = loom_gqa_pack,
    .gqa_unpack = loom_gqa_unpack,
    .convert_rows = loom_convert_rows,
    .add_rows = loom_add_rows,
    .add_bias = loom_bias_forward,
    .acc_add = loom_acc_add,
    .acc_round = loom_acc_round,
    .acc_add_rounded = loom_acc_add_rounded,
    .fp8_quantize = loom_fp8_quantize,
    .fp8_amax = loom_fp8_amax_of,
    .fp8_unscale = loom_fp8_unscale,
    .fp8_scale_into = loom_fp8_scale_into,
    .get_threads = loom_threads_get,
};

/* bf16 compute: the same table with the matrix products on the bf16 units,
 * unless the float32 path was chosen */
static const struct loom_kernels *cpu_kernels_for(enum loom_dtype compute)
{
    static struct loom_kernels bf16;
    if (compute != LOOM_DTYPE_BF16 || loom_bf16_units() == LOOM_BF16_UNITS_F32) return &cpu_kernels;
    if (!bf16.matmul_forward) {
        bf16 = cpu_kernels;
        bf16.matmul_forward = loom_matmul_forward_bf16;
        bf16.matmul_backward = loom_matmul_backward_bf16;
        bf16.lm_head_forward = loom_lm_head_forward_bf16;
        bf16.lm_head_backward = loom_lm_head_backward_bf16;
        bf16.lm_head_forward_lp = loom_lm_head_forward_lp_bf16;
        bf16.lm_head_backward_lp = loom_lm_head_backward_lp_bf16;
        bf16.lm_head_lp_scratch = NULL; /* its conversions are the kernels' own (other) */
        bf16.matmul_forward_b16 = loom_matmul_forward_b16;
        bf16.matmul_backward_b16 = loom_matmul_backward_b16;
        bf16.linear_forward = loom_linear_forward_bf16;
        bf16.linear_backward = loom_linear_backward_bf16;
        bf16.grouped_forward = loom_grouped_forward_bf16;
        bf16.grouped_backward = loom_grouped_backward_bf16;
        bf16.flash_attention_forward = loom_flash_attention_forward_bf16;
        bf16.flash_attention_backward = loom_flash_attention_backward_bf16;
    }
    return &bf16;
}

static void cpu_memset(void *p, int value, size_t bytes)
{
    if (bytes) memset(p, value, bytes);
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) memcpy(dst, src, bytes);
}

/* bf16's units (loom_bf16_units_select), then the thread count */
static int cpu_setup(int threads, enum loom_dtype compute, const char *units)
{
    int rc = compute == LOOM_DTYPE_BF16 ? loom_bf16_units_select(units) : LOOM_OK;
    if (rc == LOOM_OK && threads > 0) loom_threads_set(threads);
    return rc;
}

static const struct loom_backend cpu_backend = {
    .name = "cpu",
    .device = LOOM_DEVICE_CPU,
    .k = &cpu_kernels,
    .alloc = loom_alloc,
    .free = loom_free,
    .retag = loom_mem_retag,
    .memset = cpu_memset,
    .copy = cpu_copy,
    .upload = cpu_copy,
    .download = cpu_copy,
    .convert = loom_buf_convert,
    .synchronize = NULL,
    .setup = cpu_setup,
    .kernels_for = cpu_kernels_for,
};

const struct loom_backend *loom_backend_cpu(void)
{
    return &cpu_backend;
}
