/* The time model (see step_time.h). */
#include "plan/step_time.h"

#include <string.h>

/* Ring all-reduce of `bytes` over n ranks (reduce-scatter then all-gather). */
static double allreduce_s(double bytes, int n, double bw, double latency)
{
    return n <= 1 ? 0 : 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * latency;
}

/* Reduce-scatter or all-gather alone: half of it. */
static double half_ring_s(double bytes, int n, double bw, double latency)
{
    return n <= 1 ? 0 : (double)(n - 1) / n * bytes / bw + (n - 1) * latency;
}

void loom_step_time_predict(const struct loom_cluster *c, const struct loom_config *cfg, int world,
                            const struct loom_footprint *fp, struct loom_step_time *out)
{
    memset(out, 0, sizeof *out);
    const int tp = cfg->tensor_model_parallel_size, pp = cfg->pipeline_model_parallel_size,
              dp = world / (tp * pp), m = cfg->gradient_accumulation_steps, b = cfg->micro_batch_size,
              T = cfg->seq_length, h = cfg->hidden_size, L = cfg->num_layers,
              heads = cfg->num_attention_heads;
    const int lp = cfg->bf16 || cfg->fp16, act_bytes = lp ? 2 : 4;
    const int on_node = c->ranks_per_node < world ? c->ranks_per_node : world;
    /* a shared node's peak and bandwidth are split among its ranks */
    const double share = c->shared_node ? on_node : 1;
    const double peak = (lp ? c->peak_bf16 : c->peak_f32) * c->matmul_efficiency / share,
                 mem_bw = c->mem_bw / share;
    const double tokens = (double)cfg->global_batch_size * T;
    out->flops_per_rank = fp->flops_per_token * tokens / world;
    const int full = cfg->recompute_granularity == LOOM_RECOMPUTE_FULL;
    /* full recomputation runs each forward twice: 4 passes of 3 */
    out->compute = out->flops_per_rank * (full ? 4.0 / 3.0 : 1.0) / peak;
    /* memory-bound work per token and layer: the residual stream's norms,
     * adds and activations (about 16 passes over h values, held whole by
     * every tp rank without sequence parallelism), the MLP's activation (4h / tp, 4 passes) and the
     * attention's softmax (heads x T / tp scores, about 10 passes) */
    const double per_token_layer =
        (16.0 * h / (cfg->sequence_parallel ? tp : 1) + 16.0 * h / tp + 10.0 * heads * (double)T / tp) *
        act_bytes * (full ? 4.0 / 3.0 : 1.0);
    out->memory_bound = tokens / dp * ((double)L / pp) * per_token_layer / mem_bw;
    const double work = out->compute + out->memory_bound;
    /* the bubble: (P - 1) / (v m) of the work when stages wait on each other */
    const int v = pp > 1 && cfg->num_layers_per_virtual_pipeline_stage > 0
                      ? L / (pp * cfg->num_layers_per_virtual_pipeline_stage)
                      : 1;
    if (pp > 1) out->bubble = work * (pp - 1) / ((double)v * m);
    /* links: a group whose ranks are `stride` apart spans nodes when the span exceeds a node */
    const int tp_inter = tp > c->ranks_per_node, dp_inter = tp * dp > c->ranks_per_node,
              pp_inter = tp * dp * (pp > 1 ? 2 : 1) > c->ranks_per_node;
    const double act = (double)b * T * h * act_bytes;
    if (tp > 1) { /* two all-reduces (or reduce-scatter + all-gather) per layer each way, per micro-batch */
        const int per_layer = 4 + (full ? 2 : 0);
        out->tp_comm = (double)per_layer * ((double)L / pp) * m *
                       allreduce_s(act, tp, tp_inter ? c->inter_bw : c->intra_bw,
                                   tp_inter ? c->inter_latency : c->intra_latency);
    }
    if (pp > 1) { /* the activation forward and its gradient back, per micro-batch and model chunk */
        const double bytes =
            act / (cfg->sequence_parallel ? tp : 1) * (4.0 / act_bytes); /* sent in float32 */
        const double bw = pp_inter ? c->inter_bw : c->intra_bw,
                     lat = pp_inter ? c->inter_latency : c->intra_latency;
        out->pp_comm = 2.0 * m * v * (bytes / bw + lat);
    }
    if (dp > 1) {
        const double bw = dp_inter ? c->inter_bw : c->intra_bw,
                     lat = dp_inter ? c->inter_latency : c->intra_latency;
        const double params = (double)fp->params, grad_bytes = params * (cfg->grad_reduce_dtype ? 2 : 4),
                     param_bytes = params * (lp ? 2 : 4);
        double t;
        if (cfg->zero_stage <= 1)
            t = allreduce_s(grad_bytes, dp, bw, lat) +
                (cfg->zero_stage == 1 ? half_ring_s(param_bytes, dp, bw, lat) : 0);
        else
            t = half_ring_s(grad_bytes, dp, bw, lat) * m /* stage 2-3 reduce every micro-batch */ +
                (cfg->zero_stage == 2
                     ? half_ring_s(param_bytes, dp, bw, lat)
                     : 2.0 * m * half_ring_s(param_bytes, dp, bw, lat)); /* stage 3: gathers */
        /* hidden behind the backward (two thirds of the work) when it overlaps, without pipelining */
        const double hide = pp == 1 && !cfg->no_overlap ? work * 2.0 / 3.0 : 0;
        const double tail = 0.1 * t; /* the last bucket or unit waits after the backward */
        out->dp_comm = t - hide > tail ? t - hide : tail;
    }
    /* the optimizer reads and writes its state and the parameters and gradients once */
    const double state = (double)(fp->peak[0] + fp->peak[1] + fp->peak[2]);
    out->optimizer = 2.0 * state / mem_bw;
    if (cfg->offload_optimizer == LOOM_OFFLOAD_NVME) /* the moments (and master weights) read and written */
        out->offload = 2.0 * (double)fp->params / dp * (lp ? 12 : 8) / (c->disk_bw / share);
    out->total =
        work + out->bubble + out->tp_comm + out->pp_comm + out->dp_comm + out->optimizer + out->offload;
}
