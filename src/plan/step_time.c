/* The time model (see step_time.h). */
#include "plan/step_time.h"

#include <string.h>

#include "parallel/kinds.h"

void loom_step_time_predict(const struct loom_cluster *c, const struct loom_config *cfg, int world,
                            const struct loom_footprint *fp, struct loom_step_time *out)
{
    memset(out, 0, sizeof *out);
    struct loom_layout_shape s;
    loom_kinds_shape(cfg, world, &s);
    const int b = cfg->micro_batch_size, T = cfg->seq_length, h = cfg->hidden_size, L = cfg->num_layers,
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
     * every tp rank unless its rows are split), the MLP's activation (4h /
     * tp, 4 passes) and the attention's softmax (heads x T / tp scores,
     * about 10 passes); a rank's tokens and layers */
    const double per_token_layer =
        (16.0 * h / s.row_ways + 16.0 * h / s.tp + 10.0 * heads * (double)T / s.tp) * act_bytes *
        (full ? 4.0 / 3.0 : 1.0);
    out->memory_bound = tokens / s.dp * ((double)L / s.pp) * per_token_layer / mem_bw;
    /* each kind's terms: the bubble, and the communication on its group's
     * links (ranks are placed tp fastest, then dp, then pp) */
    const struct loom_time_in in = {.cfg = cfg,
                                    .shape = &s,
                                    .work = out->compute + out->memory_bound,
                                    .act = (double)b * T / s.cp * h * act_bytes, /* a rank's tokens */
                                    .act_bytes = act_bytes,
                                    .lp = lp,
                                    .full = full,
                                    .params = (double)fp->params,
                                    .ranks_per_node = c->ranks_per_node,
                                    .intra_bw = c->intra_bw,
                                    .intra_latency = c->intra_latency,
                                    .inter_bw = c->inter_bw,
                                    .inter_latency = c->inter_latency};
    double comm[LOOM_GROUP_COUNT];
    loom_kinds_time(&in, &out->bubble, comm);
    out->tp_comm = comm[LOOM_GROUP_TP];
    out->cp_comm = comm[LOOM_GROUP_CP];
    out->ep_comm = comm[LOOM_GROUP_EP];
    out->pp_comm = comm[LOOM_GROUP_PP];
    out->dp_comm = comm[LOOM_GROUP_DP];
    /* the optimizer reads and writes its state and the parameters and gradients once */
    const double state = (double)(fp->peak[0] + fp->peak[1] + fp->peak[2]);
    out->optimizer = 2.0 * state / mem_bw;
    if (cfg->offload_optimizer == LOOM_OFFLOAD_NVME) /* the moments (and master weights) read and written */
        out->offload = 2.0 * (double)fp->params / s.dp * (lp ? 12 : 8) / (c->disk_bw / share);
    out->total = in.work + out->bubble + out->tp_comm + out->cp_comm + out->ep_comm + out->pp_comm +
                 out->dp_comm + out->optimizer + out->offload;
}
