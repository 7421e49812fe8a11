/* An engine-API program's --metrics, --tensorboard-dir and --trace (see run_log.h). */
#include "engine/run_log.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/trace.h"
#include "engine/engine_impl.h"
#include "engine/trace_file.h"
#include "io/fs.h"
#include "loom/loom.h"

int loom_run_log_open(struct loom_engine *e)
{
    const struct loom_config *cfg = e->cfg;
    struct loom_run_log *l = &e->log;
    memset(l, 0, sizeof *l);
    int rc = LOOM_OK;
    if (e->topo.rank == 0 && *cfg->metrics) {
        if ((rc = loom_fs_check_output(cfg->metrics, "--metrics")) == LOOM_OK &&
            !(l->metrics = fopen(cfg->metrics, "a")))
            rc = loom_error_set(LOOM_ERR_INPUT, "--metrics: cannot open %s: %s", cfg->metrics,
                                strerror(errno));
    }
    if (rc == LOOM_OK && e->topo.rank == 0 && *cfg->tensorboard_dir)
        rc = loom_tb_open(&l->tb, cfg->tensorboard_dir);
    if ((rc = loom_engine_agree(e, rc))) {
        loom_run_log_close(e);
        return rc;
    }
    if ((rc = loom_engine_agree(e, loom_trace_file_begin(cfg, &e->topo, e->steps)))) {
        loom_run_log_close(e);
        return rc;
    }
    l->on = 1; /* after the trace started: loom_run_log_close writes it */
    l->t0 = loom_now();
    return LOOM_OK;
}

void loom_run_log_step_begin(struct loom_engine *e)
{
    if (!e->log.on) return;
    loom_mem_reset_peak();
    loom_trace_step_begin((int)e->steps + 1);
    e->log.t0 = loom_now();
}

/* v as JSON: null when not finite. */
static const char *json_number(char *buf, size_t n, double v)
{
    if (!isfinite(v)) return "null";
    snprintf(buf, n, "%.17g", v);
    return buf;
}

int loom_run_log_step(struct loom_engine *e, const struct loom_step_result *r)
{
    struct loom_run_log *l = &e->log;
    if (!l->on) return LOOM_OK;
    const double t1 = loom_now(), ms = 1e3 * (t1 - l->t0);
    loom_trace_step_end((int)r->step, l->t0, t1);
    struct loom_mem_stats mem;
    loom_mem_get_stats(&mem);
    if (l->metrics) {
        char loss[32], norm[32];
        fprintf(l->metrics,
                "{\"step\":%lld,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"ms_per_step\":%.6g,\"mem\":{",
                (long long)r->step, json_number(loss, sizeof loss, r->loss), r->lr,
                json_number(norm, sizeof norm, r->grad_norm), ms);
        for (int k = 0; k < LOOM_MEM_COUNT; k++)
            fprintf(l->metrics, "\"%s\":%lld,", loom_mem_tag_name((enum loom_mem_tag)k),
                    (long long)mem.peak[k]);
        fprintf(l->metrics, "\"total\":%lld}", (long long)mem.peak_total);
        if (r->loss_scale > 0) fprintf(l->metrics, ",\"loss_scale\":%.17g", r->loss_scale);
        if (r->skipped || r->skipped_total || r->loss_scale > 0)
            fprintf(l->metrics, ",\"skipped\":%d,\"skipped_total\":%lld", r->skipped,
                    (long long)r->skipped_total);
        fputs("}\n", l->metrics);
        fflush(l->metrics);
    }
    if (l->tb.f) {
        loom_tb_scalar(&l->tb, r->step, "lm loss", r->loss);
        loom_tb_scalar(&l->tb, r->step, "learning-rate", r->lr);
        loom_tb_scalar(&l->tb, r->step, "grad-norm", r->grad_norm);
        if (r->loss_scale > 0) loom_tb_scalar(&l->tb, r->step, "loss-scale", r->loss_scale);
        loom_tb_scalar(&l->tb, r->step, "iteration-time", ms / 1000);
        loom_tb_scalar(&l->tb, r->step, "memory/total-bytes", (double)mem.peak_total);
        loom_tb_flush(&l->tb);
    }
    int rc = l->metrics && ferror(l->metrics)
                 ? loom_error_set(LOOM_ERR_RUNTIME, "--metrics %s: a write failed", e->cfg->metrics)
                 : LOOM_OK;
    if (rc == LOOM_OK) rc = loom_tb_status(&l->tb);
    return rc;
}

void loom_run_log_close(struct loom_engine *e)
{
    struct loom_run_log *l = &e->log;
    const int failed = l->on && loom_trace_file_write(e->cfg, &e->topo) != LOOM_OK;
    if (l->metrics) fclose(l->metrics);
    loom_tb_close(&l->tb);
    memset(l, 0, sizeof *l);
    if (failed) { /* a run's file that cannot be written fails the run (exit 1), as under loom train */
        if (e->topo.rank == 0) fprintf(stderr, "loom: error: %s\n", loom_error_message());
        exit(LOOM_ERR_RUNTIME);
    }
}
