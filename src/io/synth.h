/*
 * The built-in corpus (`loom data synth`): a seeded source over the byte
 * vocabulary whose entropy rate is known exactly, with structure that only
 * attention can exploit.
 *
 * The stream is a sequence of segments of K+1 tokens: a marker, then a span
 * of K symbols. The marker is NEW (' ') with probability q, else COPY ('=').
 * After NEW the span is K fresh symbols drawn i.i.d. from a Zipf-like
 * distribution pi over M letters ('e', 't', 'a', ... by English frequency),
 * in lower case; after COPY it repeats the previous segment's symbols (so
 * the most recent NEW span) in upper case. The default corpus (K=2, M=16,
 * pi_i ~ 1/(i+1), q=0.2) reads " oi=OI=OI=OI tt=TT id=ID=ID te dd=DD et it".
 *
 * A repeat is predictable only by attending K+1 tokens back. The case makes
 * the kind of the current segment visible in the token just before every
 * span symbol, so the one pattern a model must learn for copying is that
 * fixed offset (the case adds no information: it follows from the marker).
 * The defaults are chosen so that the default preset (4 layers of 128
 * channels, B=16, T=64, lr 3e-3, 1200 steps) leaves the no-copy plateau
 * within a few hundred steps for every seed tried: a short offset (K=2; at
 * K=3 the plateau lasts far longer) and mostly COPY segments (q=0.2; at
 * q=0.3 one seed in three stayed on the plateau for 800 steps, and at q=1/2
 * a run stayed there for all 1200).
 *
 * Entropy rate (nats/token), exact for the quantised probabilities that the
 * generator realises (q and pi are multiples of 2^-16):
 *
 *     h = (H_b(q) + q * K * H(pi)) / (K + 1)
 *
 * (markers carry H_b(q) each; a NEW span K*H(pi); a COPY span nothing).
 * Defaults: q = 13107/2^16, H(pi) = 2.358929, h = 0.481318 nats/token;
 * the ideal loss with a 64-token window is 0.527854 (excess 0.046536), a
 * model that never copies reaches 1.739419, one that ignores context 2.375933.
 *
 * A predictor that sees only a window of T tokens pays more at the window's
 * start: it does not know where segments begin until it sees a marker, and
 * cannot copy a span whose source lies before the window.
 * loom_synth_window_xent gives the exact expected loss of the ideal such
 * predictor, averaged over the T targets of a window that starts at a
 * uniformly random position (what the shuffled sampler draws); the excess
 * over h falls as 1/T.
 *
 * Not here: natural-language data (tokenizer.h), variable-length segments.
 */
#ifndef LOOM_IO_SYNTH_H
#define LOOM_IO_SYNTH_H

#include <stdint.h>

#define LOOM_SYNTH_MARKER_NEW ' '
#define LOOM_SYNTH_MARKER_COPY '='
#define LOOM_SYNTH_MAX_SYMBOLS 26
#define LOOM_SYNTH_MAX_SPAN 64
/* Probabilities are integer weights out of this total (16-bit draws). */
#define LOOM_SYNTH_ONE 65536
/* The built-in corpus: `loom data synth` without flags, and what `loom
 * train` generates when no --data-path is given. */
#define LOOM_SYNTH_DEFAULT_TOKENS 10000000
#define LOOM_SYNTH_DEFAULT_SEED 1337

struct loom_synth_spec {
    int span;     /* K, symbols per span, 1..LOOM_SYNTH_MAX_SPAN */
    int symbols;  /* M, size of the span alphabet, 2..LOOM_SYNTH_MAX_SYMBOLS */
    double zipf;  /* pi_i proportional to (i+1)^-zipf, 0..3 */
    double p_new; /* q, probability of a NEW segment, (0, 1] */
};

/* The source as the generator realises it: every probability quantised. */
struct loom_synth_model {
    struct loom_synth_spec spec;
    uint32_t new_weight;                             /* q = new_weight / LOOM_SYNTH_ONE */
    uint32_t weight[LOOM_SYNTH_MAX_SYMBOLS];         /* pi_i = weight[i] / LOOM_SYNTH_ONE */
    unsigned char byte_new[LOOM_SYNTH_MAX_SYMBOLS];  /* symbol i's token in a NEW span */
    unsigned char byte_copy[LOOM_SYNTH_MAX_SYMBOLS]; /* ... and in a COPY span */
};

/* The default corpus's parameters. */
void loom_synth_default(struct loom_synth_spec *spec);
/* Validates and quantises; LOOM_ERR_INPUT names a bad field. */
int loom_synth_build(struct loom_synth_model *m, const struct loom_synth_spec *spec);

double loom_synth_p_new(const struct loom_synth_model *m);
double loom_synth_prob(const struct loom_synth_model *m, int symbol);
/* h above, nats/token. */
double loom_synth_entropy_rate(const struct loom_synth_model *m);
/* Expected loss (nats/token) of the ideal predictor restricted to a window:
 * the mean over targets j = 0..T-1, each predicted from window tokens
 * 0..j, of a window starting at a uniformly random phase. */
double loom_synth_window_xent(const struct loom_synth_model *m, int T);
/* Entropy of the marginal token distribution: the loss of a model that
 * ignores context entirely. */
double loom_synth_unigram_entropy(const struct loom_synth_model *m);
/* Loss of the best predictor that knows where segments begin and which
 * kind each is, but never copies: (H_b(q) + K * H(pi)) / (K + 1). */
double loom_synth_nocopy_xent(const struct loom_synth_model *m);

/* n tokens of the stream under `seed`. The stream starts at a marker; the
 * span that a first COPY repeats is drawn from pi like any other, so the
 * stream is stationary from its first token. */
void loom_synth_generate(const struct loom_synth_model *m, uint64_t seed, uint16_t *out, int64_t n);

/* Writes OUTDIR/train.bin (tokens - tokens/10 tokens), OUTDIR/val.bin
 * (tokens/10, an independent stream of the same seed) and OUTDIR/corpus.json
 * (parameters, probabilities, entropy rate, ideal window losses) for `spec`
 * (NULL: the default). *entropy_nats (may be NULL) receives h. */
int loom_data_synth_spec(const char *outdir, const struct loom_synth_spec *spec, int64_t tokens,
                         uint64_t seed, double *entropy_nats);
/* The default corpus. */
int loom_data_synth(const char *outdir, int64_t tokens, uint64_t seed, double *entropy_nats);

/* Rebuilds the source described by OUTDIR/corpus.json (so a caller can ask
 * for the ideal loss at its own T); LOOM_ERR_INPUT names the file and the
 * missing or bad key. */
int loom_synth_read(const char *outdir, struct loom_synth_model *m);
/* The entropy rate recorded in OUTDIR/corpus.json, nats/token. */
int loom_synth_read_floor(const char *outdir, double *floor_nats);

#endif
