/* Log lines, progress bar, metrics JSONL (see report.h). */
#include "app/report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/mfu.h"
#include "base/clock.h"
#include "base/log.h"
#include "config/config.h"
#include "io/fs.h"

const char *loom_fmt_bytes(char *buf, size_t n, double bytes)
{
    static const char *const units[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000 && u < 4) bytes /= 1000, u++;
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}

const char *loom_fmt_duration(char *buf, size_t n, double s)
{
    if (s < 0 || s != s) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
    return buf;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double loom_report_median(const double *v, int n)
{
    double *c = loom_alloc(sizeof(double) * (size_t)(n > 0 ? n : 1), LOOM_MEM_OTHER);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) c[k++] = v[i];
    qsort(c, (size_t)k, sizeof *c, cmp_double);
    const double m = k ? c[k / 2] : NAN;
    loom_free(c);
    return m;
}

/* A metrics file whose last row an earlier run's failed write cut (a full
 * disk) ends without a newline: appending to it would glue the next row
 * onto the fragment, a corrupt line in the middle that readers refuse. The
 * fragment (a row's start, no newline, within the last MiB) is dropped and
 * said; any other file is left as it is. */
static int drop_cut_row(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return LOOM_OK; /* missing: fopen makes it (or says why not) */
    struct stat st;
    char buf[4096];
    off_t pos = 0, keep = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) pos = st.st_size;
    while (pos > 0 && keep < 0 && st.st_size - pos < (1 << 20)) {
        const size_t n = pos < (off_t)sizeof buf ? (size_t)pos : sizeof buf;
        if (pread(fd, buf, n, pos - (off_t)n) != (ssize_t)n) break;
        for (size_t i = n; i-- > 0 && keep < 0;)
            if (buf[i] == '\n') keep = pos - (off_t)n + (off_t)i + 1;
        pos -= (off_t)n;
        if (keep < 0 && pos == 0) keep = 0; /* the whole file is the fragment */
    }
    int rc = LOOM_OK;
    char first = 0;
    if (keep >= 0 && keep < st.st_size && pread(fd, &first, 1, keep) == 1 && first == '{') {
        if (ftruncate(fd, keep) != 0)
            rc = loom_error_set(LOOM_ERR_RUNTIME, "--metrics %s: cannot drop a cut final row: %s", path,
                                strerror(errno));
        else
            fprintf(stderr,
                    "loom: note: --metrics %s: dropped a cut final row (%lld bytes, no newline) that an "
                    "earlier run's failed write left\n",
                    path, (long long)(st.st_size - keep));
    }
    close(fd);
    return rc;
}

int loom_report_open(struct loom_report *r, const char *metrics_path, const char *tensorboard_dir)
{
    memset(r, 0, sizeof *r);
    /* the bar only for a single process on a terminal: mpirun forwards output
     * through a pseudo-terminal that is no terminal of the user's */
    r->tty = loom_log_rank() == 0 && isatty(STDOUT_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE") &&
             !getenv("PMI_SIZE");
    r->t_start = loom_now();
    if (metrics_path && *metrics_path && loom_log_rank() == 0) {
        snprintf(r->metrics_path, sizeof r->metrics_path, "%s", metrics_path);
        /* a FIFO would wait for a reader: a file, or a device such as /dev/null */
        int rc = loom_fs_check_output(metrics_path, "--metrics");
        if (rc) return rc;
        rc = drop_cut_row(metrics_path);
        if (rc) return rc;
        r->metrics = fopen(metrics_path, "a");
        if (!r->metrics)
            return loom_error_set(LOOM_ERR_INPUT, "--metrics: cannot open %s: %s", metrics_path,
                                  strerror(errno));
    }
    if (tensorboard_dir && *tensorboard_dir && loom_log_rank() == 0)
        return loom_tb_open(&r->tb, tensorboard_dir);
    return LOOM_OK;
}

/* A row is out: a failed write (or flush) is remembered, with its errno. */
static void row_done(struct loom_report *r)
{
    if ((fflush(r->metrics) != 0 || ferror(r->metrics)) && !r->metrics_errno)
        r->metrics_errno = errno ? errno : EIO;
}

int loom_report_status(const struct loom_report *r)
{
    if (r->metrics_errno)
        return loom_error_set(LOOM_ERR_RUNTIME, "--metrics %s: write failed: %s", r->metrics_path,
                              strerror(r->metrics_errno));
    return loom_tb_status(&r->tb);
}

void loom_report_close(struct loom_report *r)
{
    if (r->bar_shown) fputs("\r\033[K", stdout);
    r->bar_shown = 0;
    if (r->metrics && fclose(r->metrics) != 0 && !r->metrics_errno) r->metrics_errno = errno;
    r->metrics = NULL;
    loom_tb_close(&r->tb);
}

/* A pipeline stage's idle share of its schedule, from (compute, idle, total) ms. */
static double stage_bubble(const double *stage)
{
    return stage[2] > 0 ? 1 - stage[0] / stage[2] : 0;
}

/* The step's figures as TensorBoard scalars, under Megatron's tags where it
 * has them ("lm loss", "learning-rate", "grad-norm", "loss-scale",
 * "iteration-time" in seconds), and memory by category in bytes. */
static void tb_step(struct loom_report *r, const struct loom_step_stats *s, const struct loom_mem_stats *mem)
{
    struct loom_tb *tb = &r->tb;
    if (!tb->f) return;
    loom_tb_scalar(tb, s->step, "lm loss", s->loss);
    loom_tb_scalar(tb, s->step, "learning-rate", s->lr);
    loom_tb_scalar(tb, s->step, "grad-norm", s->grad_norm);
    if (s->loss_scale > 0) loom_tb_scalar(tb, s->step, "loss-scale", s->loss_scale);
    loom_tb_scalar(tb, s->step, "iteration-time", s->ms_per_step / 1000);
    loom_tb_scalar(tb, s->step, "throughput/tokens-per-sec", s->tokens_per_s);
    loom_tb_scalar(tb, s->step, "throughput/mfu", s->mfu);
    if (s->moe) { /* Megatron's tags for the losses */
        loom_tb_scalar(tb, s->step, "load_balancing_loss", s->moe[0]);
        loom_tb_scalar(tb, s->step, "z_loss", s->moe[1]);
        loom_tb_scalar(tb, s->step, "moe/dropped-share", s->moe[2]);
        loom_tb_scalar(tb, s->step, "moe/tokens-per-expert-min", s->moe[3]);
        loom_tb_scalar(tb, s->step, "moe/tokens-per-expert-max", s->moe[4]);
        loom_tb_scalar(tb, s->step, "moe/tokens-per-expert-cv", s->moe[5]);
        for (int i = 0; i < s->moe_layers; i++) { /* Megatron's per-layer tags */
            const double *o = s->moe_layer + 4 * (size_t)i;
            char tag[96];
            snprintf(tag, sizeof tag, "moe/load_balancing_loss_layer_%d", (int)o[0]);
            loom_tb_scalar(tb, s->step, tag, o[1]);
            snprintf(tag, sizeof tag, "moe/z_loss_layer_%d", (int)o[0]);
            loom_tb_scalar(tb, s->step, tag, o[2]);
            snprintf(tag, sizeof tag, "moe/tokens-per-expert-cv_layer_%d", (int)o[0]);
            loom_tb_scalar(tb, s->step, tag, o[3]);
        }
    }
    char tag[64];
    for (int i = 0; i < LOOM_MEM_COUNT; i++) {
        snprintf(tag, sizeof tag, "memory/%s-bytes", loom_mem_tag_name((enum loom_mem_tag)i));
        loom_tb_scalar(tb, s->step, tag, (double)mem->peak[i]);
    }
    loom_tb_scalar(tb, s->step, "memory/total-bytes", (double)mem->peak_total);
    if (r->tb_timers) { /* Megatron's timers that loom measures: the exposed wait, the pipeline's idle share
                         */
        if (s->comm_wait_ms >= 0)
            loom_tb_scalar(tb, s->step, "timers/comm-wait-time", s->comm_wait_ms / 1000);
        if (s->pipeline) {
            double sum = 0;
            for (int k = 0; k < s->pp; k++) sum += stage_bubble(s->pipeline + 4 * (size_t)k);
            loom_tb_scalar(tb, s->step, "timers/pipeline-bubble", sum / s->pp);
        }
    }
    loom_tb_flush(tb);
}

void loom_report_tb(struct loom_report *r, const struct loom_step_stats *s, const struct loom_mem_stats *mem)
{
    if (!r->tb_interval || s->step % r->tb_interval == 0) tb_step(r, s, mem);
}

void loom_report_line(struct loom_report *r, const char *fmt, ...)
{
    if (loom_log_rank() != 0) return;
    if (r->bar_shown) fputs("\r\033[K", stdout);
    r->bar_shown = 0;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void loom_report_progress(struct loom_report *r, int step, int total, double loss)
{
    if (!r->tty) return;
    const int width = 30;
    int filled = (int)((double)step / total * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    double elapsed = loom_now() - r->t_start;
    char eta[32], el[32];
    loom_fmt_duration(eta, sizeof eta, step ? elapsed / step * (total - step) : 0);
    loom_fmt_duration(el, sizeof el, elapsed);
    printf("\r\033[K[%s] %3d%% %d/%d loss %.4f  %s elapsed, eta %s", bar, (int)(100.0 * step / total), step,
           total, loss, el, eta);
    fflush(stdout);
    r->bar_shown = 1;
}

static void mem_json(FILE *f, const struct loom_mem_stats *mem)
{
    fputs("{", f);
    for (int i = 0; i < LOOM_MEM_COUNT; i++)
        fprintf(f, "\"%s\":%lld,", loom_mem_tag_name((enum loom_mem_tag)i), (long long)mem->peak[i]);
    fprintf(f, "\"total\":%lld}", (long long)mem->peak_total);
}

/* A double as JSON: 17 digits, or null for inf and NaN (JSON has neither). */
static const char *json_number(char *buf, size_t n, double x)
{
    if (isfinite(x))
        snprintf(buf, n, "%.17g", x);
    else
        snprintf(buf, n, "null");
    return buf;
}

void loom_report_step(struct loom_report *r, const struct loom_step_stats *s,
                      const struct loom_mem_stats *mem, const int64_t *mem_by_rank, int world)
{
    tb_step(r, s, mem);
    int digits = snprintf(NULL, 0, "%d", s->total);
    char extra[160] = "";
    if (s->loss_scale > 0) snprintf(extra, sizeof extra, " | loss scale %g", s->loss_scale);
    if (s->ramp_batch)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " | global batch %d", s->ramp_batch);
    if (s->pipeline) { /* the mean idle share of the stages (see the metrics' "pipeline") */
        double sum = 0;
        for (int k = 0; k < s->pp; k++) {
            sum += stage_bubble(s->pipeline + 4 * (size_t)k);
        }
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " | bubble %.1f%%", 100 * sum / s->pp);
    }
    if (s->skipped)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 " | skipped (non-finite gradient; %lld so far)", (long long)s->skipped_total);
    if (s->moe) {
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 " | moe balance %.4f z %.3f, experts %.2f-%.2fx cv %.2f", s->moe[0], s->moe[1], s->moe[3],
                 s->moe[4], s->moe[5]);
        if (s->moe[2] > 0)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", dropped %.1f%%",
                     100 * s->moe[2]);
    }
    char mfu[48];
    loom_mfu_text(mfu, sizeof mfu, s->mfu);
    loom_report_line(
        r, "step %*d/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | mfu %s | %.1f ms/step%s\n",
        digits, s->step, s->total, s->loss, s->lr, s->grad_norm, s->tokens_per_s, mfu, s->ms_per_step, extra);
    if (r->metrics) {
        char loss[32], norm[32];
        fprintf(r->metrics,
                "{\"step\":%d,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"tokens_per_s\":%.17g,\"mfu\":%.17g,"
                "\"ms_per_step\":%.6g,\"mem\":",
                s->step, json_number(loss, sizeof loss, s->loss), s->lr,
                json_number(norm, sizeof norm, s->grad_norm), s->tokens_per_s, s->mfu, s->ms_per_step);
        mem_json(r->metrics, mem);
        if (*r->layout) fprintf(r->metrics, ",\"layout\":\"%s\"", r->layout);
        if (s->comm_wait_ms >= 0) fprintf(r->metrics, ",\"comm_wait_ms\":%.6g", s->comm_wait_ms);
        if (s->loss_scale > 0) fprintf(r->metrics, ",\"loss_scale\":%.17g", s->loss_scale);
        if (s->ramp_batch) fprintf(r->metrics, ",\"global_batch_size\":%d", s->ramp_batch);
        if (s->skipped || s->skipped_total || s->loss_scale > 0)
            fprintf(r->metrics, ",\"skipped\":%d,\"skipped_total\":%lld", s->skipped,
                    (long long)s->skipped_total);
        if (s->pipeline) { /* each stage's idle share of its schedule, and their mean: the bubble */
            double sum = 0;
            fputs(",\"pipeline\":{\"stages\":[", r->metrics);
            for (int k = 0; k < s->pp; k++) {
                const double *st = s->pipeline + 4 * (size_t)k, bubble = stage_bubble(st);
                sum += bubble;
                fprintf(r->metrics,
                        "%s{\"compute_ms\":%.6g,\"idle_ms\":%.6g,\"total_ms\":%.6g,\"bubble\":%.6g,"
                        "\"activations\":%.0f}",
                        k ? "," : "", st[0], st[1], st[2], bubble, st[3]);
            }
            fprintf(r->metrics, "],\"bubble\":%.6g}", sum / s->pp);
        }
        if (s->moe)
            fprintf(r->metrics,
                    ",\"load_balancing_loss\":%.9g,\"z_loss\":%.9g,\"moe\":{\"dropped_share\":%.6g,"
                    "\"tokens_per_expert\":{\"min\":%.6g,\"max\":%.6g,\"cv\":%.6g}",
                    s->moe[0], s->moe[1], s->moe[2], s->moe[3], s->moe[4], s->moe[5]);
        for (int i = 0; s->moe && i < s->moe_layers; i++) {
            const double *o = s->moe_layer + 4 * (size_t)i;
            fprintf(
                r->metrics,
                "%s{\"layer\":%d,\"load_balancing_loss\":%.9g,\"z_loss\":%.9g,\"tokens_per_expert_cv\":%.6g}",
                i ? "," : ",\"layers\":[", (int)o[0], o[1], o[2], o[3]);
            if (i == s->moe_layers - 1) fputc(']', r->metrics);
        }
        if (s->moe) fputc('}', r->metrics);
        if (mem_by_rank) {
            fputs(",\"mem_by_rank\":[", r->metrics);
            for (int k = 0; k < world; k++) {
                const int64_t *row = mem_by_rank + (size_t)k * (LOOM_MEM_COUNT + 1);
                fputs(k ? ",{" : "{", r->metrics);
                for (int i = 0; i < LOOM_MEM_COUNT; i++)
                    fprintf(r->metrics, "\"%s\":%lld,", loom_mem_tag_name((enum loom_mem_tag)i),
                            (long long)row[i]);
                fprintf(r->metrics, "\"total\":%lld}", (long long)row[LOOM_MEM_COUNT]);
            }
            fputs("]", r->metrics);
        }
        fputs("}\n", r->metrics);
        row_done(r);
    }
}

void loom_report_eval(struct loom_report *r, int step, double val_loss, double floor_nats)
{
    if (floor_nats > 0)
        loom_report_line(r, "eval at step %d | val loss %.4f | corpus floor %.4f (+%.4f)\n", step, val_loss,
                         floor_nats, val_loss - floor_nats);
    else
        loom_report_line(r, "eval at step %d | val loss %.4f\n", step, val_loss);
    loom_report_eval_row(r, step, val_loss);
}

/* s as a JSON string's contents. */
static void json_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
}

void loom_report_config(struct loom_report *r, const struct loom_config *cfg)
{
    if (!r->metrics) return;
    fputs("{\"config\":{", r->metrics);
    for (int i = 0; i < loom_config_count(); i++) {
        const char *name;
        char v[1024];
        loom_config_setting(cfg, i, &name, v, sizeof v);
        fprintf(r->metrics, "%s\"", i ? "," : "");
        json_escaped(r->metrics, name);
        fputs("\":\"", r->metrics);
        json_escaped(r->metrics, v);
        fputc('"', r->metrics);
    }
    fputs("}}\n", r->metrics);
    row_done(r);
}

void loom_report_eval_row(struct loom_report *r, int step, double val_loss)
{
    if (r->tb.f) {
        loom_tb_scalar(&r->tb, step, "lm loss validation", val_loss);
        loom_tb_flush(&r->tb);
    }
    if (!r->metrics) return;
    char v[32] = "null"; /* JSON has no NaN */
    if (isfinite(val_loss)) snprintf(v, sizeof v, "%.9g", val_loss);
    fprintf(r->metrics, "{\"step\":%d,\"val_loss\":%s}\n", step, v);
    row_done(r);
}
