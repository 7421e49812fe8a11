#!/usr/bin/env python3
"""Megatron's batch-size rampup: --rampup-batch-size START INCREMENT SAMPLES.

The schedule is Megatron's, written out here on its own (its
RampupBatchsizeNumMicroBatchesCalculator and update_train_iters): the
batch is START + INCREMENT x int(consumed / (SAMPLES / increments)) until
more than SAMPLES are consumed, then --global-batch-size; the steps are the
ramp's (its last past SAMPLES included) and then whole batches of what
--train-samples leaves. Checked on a tiny GPT-2 (shuffled shards):

  - every step's global batch (the metrics' global_batch_size) and the step
    count are the schedule's; the learning rate follows the samples (linear
    warmup over --lr-warmup-samples, cosine decay over --train-samples, at
    the samples taken through the step), within 1e-8 relative (the metrics
    print 9 digits);
  - step 1 is a constant-batch run of START's step 1, bit for bit (the same
    rows: shuffled rows are keyed by step and row);
  - DP 2 and PP 2, 1F1B and GPipe (whose micro-batches per step, and
    GPipe's activation slots, change with the batch) equal one process within
    1e-5 relative per step (float32 sums in another order);
  - a run stopped mid-ramp and resumed from its checkpoint continues bit for
    bit (the consumed samples follow from the step);
  - bad settings are one line, exit 2.
"""
import math
import os
import sys
import tempfile

import lib
from lib import check, rel

START, INC, SAMPLES, G, TRAIN = 4, 4, 40, 16, 200
MAX_LR, MIN_LR, WARMUP = 3e-3, 3e-4, 16


def megatron_batches():
    """(every step's global batch, the step count), as Megatron computes them."""
    increments = (G - START) // INC
    per = SAMPLES / increments

    def batch(consumed):
        return G if consumed > SAMPLES else START + int(consumed / per) * INC

    consumed, iters = 0, 0
    while consumed <= SAMPLES and consumed <= TRAIN:
        consumed += batch(consumed)
        iters += 1
    iters += (TRAIN - consumed) // G
    out, consumed = [], 0
    for _ in range(iters):
        out.append(batch(consumed))
        consumed += out[-1]
    return out, iters


def lr_at(samples):
    if samples <= WARMUP:
        return MAX_LR * samples / WARMUP
    ratio = (samples - WARMUP) / (TRAIN - WARMUP)
    return MIN_LR + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (MAX_LR - MIN_LR)


def base(tmp, metrics, ramp=True):
    flags = [lib.LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--data-order", "shuffled",
             *lib.TINY_MODEL, "--global-batch-size", G, "--micro-batch-size", 2, "--lr", MAX_LR, "--min-lr", MIN_LR,
             "--lr-decay-style", "cosine", "--log-interval", 1, "--eval-iters", 0, "--threads", 1, "--seed", 7,
             "--metrics", metrics]
    if ramp:
        flags += ["--rampup-batch-size", START, INC, SAMPLES, "--train-samples", TRAIN, "--lr-warmup-samples",
                  WARMUP]
    return [str(a) for a in flags]


def run(tmp, tag, n, extra=()):
    metrics = os.path.join(tmp, f"{tag}.jsonl")
    p = lib.run_ranks(n, base(tmp, metrics) + [str(a) for a in extra], tag=tag)
    return lib.metrics_rows(metrics), p


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        want, iters = megatron_batches()
        one, p = run(tmp, "one", 1)
        got = [r.get("global_batch_size") for r in one]
        check(f"every step's global batch is Megatron's ramp ({got[:9]} ...), {iters} steps "
              f"(--train-samples {TRAIN})", got == want, f"{got} vs {want}")
        consumed, lr_errs = 0, []
        for r, g in zip(one, want):
            consumed += g
            lr_errs.append(rel(r["lr"], lr_at(consumed)))
        check(f"the learning rate follows the samples taken (warmup {WARMUP}, cosine to {TRAIN}): worst rel "
              f"{max(lr_errs):.1e}", max(lr_errs) <= 1e-8)

        # step 1 of the ramp is a constant START batch's step 1
        m0 = os.path.join(tmp, "start.jsonl")
        flags = base(tmp, m0, ramp=False) + ["--train-iters", "1"]
        flags[flags.index("--global-batch-size") + 1] = str(START)
        lib.run_ranks(1, flags, tag="constant START")
        first = lib.metrics_rows(m0)
        check("step 1 is --global-batch-size START's step 1: loss and gradient norm bit for bit",
              first and (first[0]["loss"], first[0]["grad_norm"]) == (one[0]["loss"], one[0]["grad_norm"]),
              f"{first[:1]} vs {one[:1]}")

        for tag, n, extra in [("dp2", 2, ["--micro-batch-size", "2"]),
                              ("pp2", 2, ["--pipeline-model-parallel-size", "2"]),
                              ("pp2-gpipe", 2, ["--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                                                "gpipe"])]:
            rows, _ = run(tmp, tag, n, extra)
            errs = [rel(a["loss"], b["loss"]) for a, b in zip(rows, one)]
            check(f"{tag}: every step's loss within 1e-5 of one process (worst {max(errs, default=1):.1e}), the "
                  f"same batches", len(rows) == len(one) and max(errs) <= 1e-5 and
                  [r.get("global_batch_size") for r in rows] == want)

        # stopped mid-ramp (after step 5, batch 8) and resumed
        ck = os.path.join(tmp, "ck")
        run(tmp, "first", 1, ["--save", ck, "--exit-interval", 5])
        rest, p = run(tmp, "rest", 1, ["--load", ck, "--save", ck])
        check(f"stopped at step 5 mid-ramp and resumed: steps 6-{iters} bit for bit",
              [(r["step"], r["loss"]) for r in rest] == [(r["step"], r["loss"]) for r in one[5:]],
              f"{[r['step'] for r in rest]} {p.stderr[-300:]}")

        data = ["train", "--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL, "--global-batch-size", "16",
                "--micro-batch-size", "2", "--eval-iters", "0"]
        for name, extra, needles in [
            ("two values", ["--rampup-batch-size", "4", "4", "--train-samples", "200"], ["--rampup-batch-size", "3"]),
            ("iteration-based", ["--rampup-batch-size", "4", "4", "40", "--train-iters", "20"], ["--train-samples"]),
            ("steps that miss --global-batch-size", ["--rampup-batch-size", "4", "8", "40", "--train-samples", "200"],
             ["--global-batch-size 16"]),
            ("a batch of part micro-batches", ["--rampup-batch-size", "3", "1", "40", "--train-samples", "200"],
             ["--micro-batch-size 2"]),
            ("a schedule in steps", ["--rampup-batch-size", "4", "4", "40", "--train-samples", "200",
                                     "--lr-decay-iters", "10"], ["--lr-decay-samples", "--lr-decay-iters"]),
            ("the sequential order", ["--rampup-batch-size", "4", "4", "40", "--train-samples", "200",
                                      "--data-order", "sequential"], ["sequential"]),
            ("--layout-invariant", ["--rampup-batch-size", "4", "4", "40", "--train-samples", "200",
                                    "--layout-invariant", "1"], ["--layout-invariant"]),
        ]:
            lib.check_refused(f"refused: {name}", lib.loom(*data, *extra), needles)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
