#!/usr/bin/env python3
"""Context parallelism (--context-parallel-size, --cp-comm-type a2a) against
one process.

Each case trains lib.TINY_MODEL (sequences of 16 tokens, 4 heads) for
lib.STEPS steps on the built-in corpus, with the same global batch, and
compares every step's loss and the final weights with the one-process run
by lib.compare_runs (1e-5 in float32: the layouts only reorder float32 sums;
its docstring gives the measurement). GPT-2 (learned positions: a context
rank looks up its tokens' places in the sequence) and Llama (rotary
positions at those places; grouped-query heads, 2 key/value groups, so each
of 2 context ranks gets one):

  - CP 2 alone; with packed documents (--reset-position-ids,
    --reset-attention-mask, --eod-mask-loss: the document starts are the
    whole rows', the loss mean over the whole rows' kept tokens);
  - CP 2 x DP 2, CP 2 with ZeRO-3 (its shards over the data x context
    group), CP 2 x TP 2 + SP, CP 2 x PP 2, CP 2 with full recomputation,
    CP 4 (8 chunks of 2 tokens);
  - bf16 (lib.compare_runs' bf16 bounds and their reason);
  - a CP 2 checkpoint resumed in one process, and one process's resumed
    under CP 2: the remaining steps against the uninterrupted run.

So that the comparisons can fail: a GPT-2 run with other positions
(--seq-length 8) is at least 10x the bound away from the one-process run,
and so is CP 2 without the documents from the one-process run with them
(both checked).

Bad settings, one line and exit 2 on 2 ranks: a sequence not divisible into
2 cp chunks, heads not divisible for a2a, a world the context group does
not divide, the (T,T) kernels, --layout-invariant, and the comm types not
built yet.
"""
import os
import sys
import tempfile

import lib
from lib import check

import numpy as np

from pyref import shard, train

EOD = 5
CP2 = ["--context-parallel-size", "2", "--cp-comm-type", "a2a"]
BATCH = ["--global-batch-size", "8", "--micro-batch-size", "2"]
DOCS = ["--eod-token-id", str(EOD), "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"]
LLAMA = ["--model", "llama-tiny", "--num-query-groups", "2"]
# bf16: lib.compare_runs' bounds for 16-bit runs (its docstring: a float32
# sum in another order flips a bf16 rounding, one bf16 step in a weight)
BF16 = dict(tol=1e-4, wtol=4e-3)


def layouts(tmp):
    """Returns GPT-2's one-process run."""
    ones = {}
    for family, base in (("gpt2", []), ("llama", LLAMA)):
        one = ones[family] = lib.tiny_run(tmp, f"{family}-one", 1, base + lib.TINY_MODEL + BATCH)
        cases = [("CP 2", 2, CP2), ("CP 2 x DP 2", 4, CP2), ("CP 2, ZeRO-3", 2, CP2 + ["--zero-stage", "3"]),
                 ("CP 2 x PP 2", 4, CP2 + ["--pipeline-model-parallel-size", "2"]),
                 ("CP 2, full recomputation", 2, CP2 + ["--recompute-granularity", "full", "--recompute-method",
                                                        "uniform", "--recompute-num-layers", "1"])]
        if family == "gpt2":
            cases += [("CP 4", 4, ["--context-parallel-size", "4", "--cp-comm-type", "a2a"]),
                      ("CP 2 x TP 2 + SP", 4, CP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"])]
        runs = {}
        for tag, n, extra in cases:
            runs[tag] = lib.tiny_run(tmp, f"{family}-{tag.replace(' ', '')}", n, base + lib.TINY_MODEL + BATCH + extra)
            lib.compare_runs(f"{family} {tag}", one, runs[tag])
        if family == "gpt2":
            # the comparison can fail: positions of an 8-token sequence are another model
            short = lib.tiny_run(tmp, "gpt2-short", 1, base + lib.TINY_MODEL + BATCH + ["--seq-length", "8"])
            apart = max(lib.rel(a, b) for a, b in zip(short[0], one[0]))
            check(f"{family}: a run with other positions is {apart:.1e} away (at least 10x the bound)",
                  apart >= 1e-4)
        # 16 bits
        one16 = lib.tiny_run(tmp, f"{family}-one-bf16", 1, base + lib.TINY_MODEL + BATCH + ["--bf16"])
        got16 = lib.tiny_run(tmp, f"{family}-cp2-bf16", 2, base + lib.TINY_MODEL + BATCH + CP2 + ["--bf16"])
        lib.compare_runs(f"{family} CP 2 bf16", one16, got16, **BF16)
    return ones["gpt2"]


def documents(tmp):
    """Packed documents under CP 2 (their own corpus: an EOD about one token in six)."""
    d = os.path.join(tmp, "docs")
    os.makedirs(d)
    rng = np.random.default_rng(9)
    toks = train.make_tokens(200000, 9) % 256
    toks[rng.random(len(toks)) < 1 / 6] = EOD
    shard.write(os.path.join(d, "train.bin"), toks)
    for family, base in (("gpt2", []), ("llama", LLAMA)):
        one = lib.tiny_run(d, f"{family}-docs-one", 1, base + lib.TINY_MODEL + BATCH + DOCS)
        plain = lib.tiny_run(d, f"{family}-nodocs-cp2", 2, base + lib.TINY_MODEL + BATCH + CP2)
        for tag, n, extra in (("CP 2", 2, CP2), ("CP 2 x DP 2", 4, CP2)):
            got = lib.tiny_run(d, f"{family}-docs-{tag.replace(' ', '')}", n, base + lib.TINY_MODEL + BATCH + DOCS + extra)
            lib.compare_runs(f"{family} packed documents, {tag}", one, got)
        apart = max(lib.rel(a, b) for a, b in zip(plain[0], one[0]))
        check(f"{family}: without the documents CP 2 is {apart:.1e} away (at least 10x the bound)", apart >= 1e-4)


def resume(tmp, one):
    """A CP 2 run's checkpoint at step 10 resumed in one process, and the
    converse: the last 10 steps against the uninterrupted one-process run
    one."""
    for tag, first, then in (("CP 2 -> 1 process", (2, CP2), (1, [])), ("1 process -> CP 2", (1, []), (2, CP2))):
        name = tag.split()[0] + tag.split()[-1]
        half = lib.tiny_run(tmp, f"resume-{name}-a", first[0],
                            lib.TINY_MODEL + BATCH + first[1] + ["--exit-interval", "10"])
        save = os.path.join(tmp, f"resume-{name}-a")
        metrics = os.path.join(tmp, f"resume-{name}-b.jsonl")
        cmd = [lib.LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--data-order", "shuffled"] + \
            lib.TINY_MODEL + BATCH + then[1] + [
                "--train-iters", str(lib.STEPS), "--lr", "3e-3", "--lr-warmup-iters", "3", "--clip-grad", "0.5",
                "--weight-decay", "0.1", "--log-interval", "1", "--eval-iters", "0", "--threads", "1", "--seed", "7",
                "--metrics", metrics, "--load", save, "--comm-timeout", "60"]
        lib.run_ranks(then[0], cmd, tag=tag)
        rest = [r["loss"] for r in lib.metrics_rows(metrics)]
        got = half[0][:10] + rest
        worst = max((lib.rel(a, b) for a, b in zip(got, one[0])), default=1.0)
        check(f"{tag}: {len(got)} steps, worst loss rel err {worst:.1e} (tol 1e-5)",
              len(got) == lib.STEPS and worst <= 1e-5, f"{got} vs {one[0]}")


def bad_settings(tmp):
    data = ["--data-path", os.path.join(tmp, "train.bin")]
    base = [lib.LOOM, "train"] + data + lib.TINY_MODEL + ["--train-iters", "1", "--eval-iters", "0"]
    cases = [
        ("a sequence not cut into 2 cp chunks", 2, CP2 + ["--seq-length", "10"],
         ["--context-parallel-size 2", "--seq-length 10", "4"]),
        ("heads not divisible for a2a", 2, CP2 + ["--num-attention-heads", "1", "--hidden-size", "32"],
         ["--cp-comm-type a2a", "--num-attention-heads 1"]),
        ("key/value groups not divisible for a2a", 2, LLAMA[:2] + ["--num-query-groups", "1"] + CP2,
         ["--cp-comm-type a2a", "key/value groups 1"]),
        ("a world the context group does not divide", 3, CP2, ["context-parallel size 2", "3"]),
        ("context parallelism with the (T,T) kernels", 2, CP2 + ["--attention-backend", "unfused"],
         ["--context-parallel-size", "--attention-backend unfused"]),
        ("context parallelism with --layout-invariant", 2, CP2 + ["--layout-invariant", "1"],
         ["--context-parallel-size", "--layout-invariant"]),
        ("--cp-comm-type p2p, not built yet", 2, ["--context-parallel-size", "2"], ["--cp-comm-type p2p"]),
        ("--cp-comm-type all_gather, not built yet", 2,
         ["--context-parallel-size", "2", "--cp-comm-type", "all_gather"], ["--cp-comm-type all_gather"]),
    ]
    for name, n, extra, needles in cases:
        p = lib.run_ranks(n, base + extra, expect=None, timeout=120)
        lines = lib.error_lines(p.stderr)
        check(f"{name}: exit 2, one line", p.returncode == 2 and len(lines) == 1 and
              all(s in lines[0] for s in needles), f"exit {p.returncode}: {p.stderr[-600:]}")
        if lines:
            print(f"     {lines[0]}")


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        one = layouts(tmp)
        documents(tmp)
        resume(tmp, one)
        bad_settings(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
