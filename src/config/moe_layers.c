/*
 * Megatron's --moe-layer-freq (config.h): an integer N, every N-th layer
 * from layer 0 an MoE layer, or a Python list expression with one 0 or 1 a
 * layer, as Megatron's scripts write it: "[1,0,1,1]", "[0]*3+[1]*29",
 * "([1]*3+[0]*1)*8". The expression's grammar (Megatron evaluates it with
 * Python; these are the forms its scripts use):
 *
 *   expr := term ('+' term)*
 *   term := factor ('*' INT)* | INT '*' factor
 *   factor := '[' INT (',' INT)* ']' | '(' expr ')'
 *
 * Spaces are ignored; every element must be 0 or 1.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "config/config.h"

struct parser {
    const char *s;
    char *out; /* the layers so far, '0' or '1' each */
    int n, cap;
    const char *why;
};

static void skip(struct parser *p)
{
    while (*p->s == ' ') p->s++;
}

static int number(struct parser *p, long *v)
{
    skip(p);
    if (!isdigit((unsigned char)*p->s)) return 0;
    *v = 0;
    while (isdigit((unsigned char)*p->s)) {
        *v = *v * 10 + (*p->s++ - '0');
        if (*v > LOOM_MOE_MAX_LAYERS) return p->why = "a count above the layers allowed", 0;
    }
    return 1;
}

static int expr(struct parser *p);

/* out[from, n) repeated to r copies in all. */
static int repeat(struct parser *p, int from, long r)
{
    const int len = p->n - from;
    if ((long)len * r > p->cap - from) return p->why = "more layers than allowed", 0;
    for (long i = 1; i < r; i++) memmove(p->out + p->n + (i - 1) * len, p->out + from, (size_t)len);
    p->n = from + (int)(len * r);
    return 1;
}

static int factor(struct parser *p)
{
    skip(p);
    if (*p->s == '(') {
        p->s++;
        if (!expr(p)) return 0;
        skip(p);
        if (*p->s != ')') return p->why = p->why ? p->why : "')' expected", 0;
        p->s++;
        return 1;
    }
    if (*p->s != '[') return p->why = p->why ? p->why : "a list '[...]' or '(' expected", 0;
    p->s++;
    for (;;) {
        long v;
        if (!number(p, &v)) return p->why = p->why ? p->why : "a 0 or 1 expected in the list", 0;
        if (v > 1) return p->why = "each layer's entry must be 0 (dense) or 1 (experts)", 0;
        if (p->n >= p->cap) return p->why = "more layers than allowed", 0;
        p->out[p->n++] = (char)('0' + v);
        skip(p);
        if (*p->s == ',') {
            p->s++;
            continue;
        }
        if (*p->s == ']') {
            p->s++;
            return 1;
        }
        return p->why = "',' or ']' expected in the list", 0;
    }
}

static int term(struct parser *p)
{
    const int from = p->n;
    long r;
    skip(p);
    if (isdigit((unsigned char)*p->s)) { /* INT '*' factor */
        if (!number(p, &r)) return 0;
        skip(p);
        if (*p->s != '*') return p->why = "'*' expected after a count", 0;
        p->s++;
        return factor(p) && repeat(p, from, r);
    }
    if (!factor(p)) return 0;
    for (;;) {
        skip(p);
        if (*p->s != '*') return 1;
        p->s++;
        if (!number(p, &r)) return p->why = p->why ? p->why : "a count expected after '*'", 0;
        if (!repeat(p, from, r)) return 0;
    }
}

static int expr(struct parser *p)
{
    if (!term(p)) return 0;
    for (;;) {
        skip(p);
        if (*p->s != '+') return 1;
        p->s++;
        if (!term(p)) return 0;
    }
}

int loom_moe_layers_parse(const char *text, struct loom_moe_layers *out)
{
    memset(out, 0, sizeof *out);
    char *list = out->list;
    const char *s = text;
    while (*s == ' ') s++;
    char *end;
    const long n = strtol(s, &end, 10);
    if (end != s && *end == '\0') {
        if (n < 1 || n > LOOM_MOE_MAX_LAYERS)
            return loom_error_set(LOOM_ERR_INPUT, "--moe-layer-freq %s: an integer must be in [1, %d]", text,
                                  LOOM_MOE_MAX_LAYERS);
        out->freq = (int)n;
        list[0] = '\0';
        return LOOM_OK;
    }
    struct parser p = {.s = s, .out = list, .cap = LOOM_MOE_MAX_LAYERS};
    if (expr(&p)) {
        skip(&p);
        if (*p.s) p.why = "unexpected text after the expression";
    }
    if (p.why || !p.n)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--moe-layer-freq '%s': %s (an integer, or a list of 0 and 1 a layer such "
                              "as \"[1,0,1,1]\" or \"([0]*1+[1]*3)*2\")",
                              text, p.why ? p.why : "no layers");
    list[p.n] = '\0';
    out->freq = 0;
    return LOOM_OK;
}

int loom_moe_layers_is(const struct loom_moe_layers *m, int l)
{
    if (m->freq > 0) return l % m->freq == 0;
    return l >= 0 && l < LOOM_MOE_MAX_LAYERS && m->list[l] == '1'; /* '\0' past the list's end */
}

int loom_moe_layers_count(const struct loom_moe_layers *m, int num_layers)
{
    int n = 0;
    for (int l = 0; l < num_layers; l++) n += loom_moe_layers_is(m, l);
    return n;
}

/* The list as the shortest of two expressions: runs ("[0]*1+[1]*3"), or
 * the shortest period repeated ("[1,0]*4"); "[1]" for a run of one. */
static void runs_text(const char *list, int n, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < cap;) {
        int j = i;
        while (j < n && list[j] == list[i]) j++;
        k += (size_t)snprintf(buf + k, cap - k, "%s[%c]", i ? "+" : "", list[i]);
        if (j - i > 1 && k < cap) k += (size_t)snprintf(buf + k, cap - k, "*%d", j - i);
        i = j;
    }
}

void loom_moe_layers_text(const struct loom_moe_layers *m, char *buf, size_t cap)
{
    if (m->freq > 0) {
        snprintf(buf, cap, "%d", m->freq);
        return;
    }
    const char *list = m->list;
    const int n = (int)strlen(list);
    char runs[4 * LOOM_MOE_MAX_LAYERS + 16], period[4 * LOOM_MOE_MAX_LAYERS + 16];
    runs_text(list, n, runs, sizeof runs);
    int p = 1;
    while (p < n && !(n % p == 0 && strncmp(list, list + p, (size_t)(n - p)) == 0)) p++;
    size_t k = (size_t)snprintf(period, sizeof period, "[");
    for (int i = 0; i < p && k < sizeof period; i++)
        k += (size_t)snprintf(period + k, sizeof period - k, "%s%c", i ? "," : "", list[i]);
    if (k < sizeof period) k += (size_t)snprintf(period + k, sizeof period - k, "]");
    if (n / p > 1 && k < sizeof period) snprintf(period + k, sizeof period - k, "*%d", n / p);
    snprintf(buf, cap, "%s", strlen(period) <= strlen(runs) ? period : runs);
}
