#!/usr/bin/env python3
"""Dropout (--hidden-dropout, --attention-dropout, --embedding-dropout).

Against PyTorch: GPT-2 (tests/pyref/gpt2.py) with every dropout at 0.1, 20
steps of two micro-batches each, trained by `loom train` and by PyTorch
applying the same masks (tests/pyref/dropout.py computes loom's counter
hash in numpy: each element's mask from the seed, the step, the layer, the
site and its global index). Checked per step: loss within 1e-5 relative
(both are float32 programs summing in other orders, test_train_torch
measures such runs 1e-7 apart; a mask off by one element, a missing scale
or a wrong backward through the mask moves the loss by 1e-3 or more), and
the same run without masks must differ from loom's by more than 1e-4 (the
masks are really drawn and applied).

Across layouts: the same masks on one process, DP 2, TP 2 + SP, PP 2,
ZeRO-3 and context parallelism 2 (p2p's ring and a2a's heads: masks keyed by
global positions and heads) (lib.compare_runs: every loss within 1e-5, the weights within its
bound), and under --layout-invariant 2 DP 2, TP 2 + SP, PP 2 and ZeRO-3 give one process's
bits. Bad settings: p of 1 or below 0, and attention dropout with the
unfused attention, are one line and exit 2.
"""
import os
import re
import sys
import tempfile

import torch

import lib
from lib import check, rel
from pyref import dropout, shard, st, train

P = 0.1
SEED = 5
TOL = 1e-5


def main():
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        # ---- PyTorch with the same masks ----
        init = train.initial_weights()
        init_path = os.path.join(tmp, "init.safetensors")
        st.save(init_path, init, {"format": "pt"})
        tokens = train.make_tokens(train.ITERS * 2 * train.B * train.T + 1, 11)
        data_path = os.path.join(tmp, "train.bin")
        shard.write(data_path, tokens)
        G = 2 * train.B
        masks = dropout.Masks(P, P, P, SEED)
        ref = train.reference(init, tokens, G, 1.0, drop=masks)
        plain = train.reference(init, tokens, G, 1.0)
        metrics = os.path.join(tmp, "m.jsonl")
        args = train.loom_args(init_path, data_path, G, 1.0, metrics,
                               ["--seed", SEED, "--hidden-dropout", P, "--attention-dropout", P])
        steps, err = lib.train_steps(args, metrics)
        if err:
            check("loom train with dropout 0.1", False, err)
            return lib.verdict()
        errs = [rel(steps[s + 1]["loss"], ref[s][0]) for s in range(train.ITERS)]
        moved = max(rel(steps[s + 1]["loss"], plain[s][0]) for s in range(train.ITERS))
        check(f"GPT-2, dropout {P} everywhere, 20 steps: loss vs PyTorch with the same masks within {TOL}",
              max(errs) <= TOL, f"worst {max(errs):.2e} at step {errs.index(max(errs)) + 1}")
        print(f"  worst loss error {max(errs):.2e}; against PyTorch without dropout {moved:.2e}")
        check("the masks change the run (vs PyTorch without dropout: more than 1e-4)", moved > 1e-4,
              f"{moved:.2e}")

        # ---- the same masks on every layout ----
        lib.write_corpus(tmp)
        drop = ["--hidden-dropout", str(P), "--attention-dropout", str(P), "--embedding-dropout", "0.2"]
        one = lib.tiny_run(tmp, "one", 1, ["--global-batch-size", "8", "--micro-batch-size", "2", *drop])
        none = lib.tiny_run(tmp, "none", 1, ["--global-batch-size", "8", "--micro-batch-size", "2"])
        check("dropout moves the tiny run's losses", one[0] != none[0])
        # evaluation drops nothing: the checkpoint records dropout 0.1, and flags of 0 win over it
        evals = []
        for extra in ([], ["--hidden-dropout", "0", "--attention-dropout", "0", "--embedding-dropout", "0"]):
            p = lib.loom("eval", "--load", os.path.join(tmp, "one"), "--valid-data-path",
                         os.path.join(tmp, "train.bin"), "--eval-iters", "2", *extra)
            m = re.search(r"val(?:idation)? loss[ :=]+([\d.]+)", p.stdout)
            evals.append(m.group(1) if p.returncode == 0 and m else p.stdout[-300:] + p.stderr[-300:])
        check(f"evaluation drops nothing: the dropout run's checkpoint evaluates the same with its dropout and "
              f"with none ({evals})", evals[0] == evals[1] and evals[0][:1].isdigit())
        p = lib.loom("eval", "--load", os.path.join(tmp, "one"), "--valid-data-path", os.path.join(tmp, "train.bin"),
                     "--eval-iters", "2", "--attention-backend", "unfused")
        check("... and its attention dropout does not stop an evaluation on the unfused attention (nothing drops)",
              p.returncode == 0, p.stderr[-300:])
        # a resume draws the masks from the checkpoint's seed, whatever --seed says now
        ck, tail = os.path.join(tmp, "resume"), os.path.join(tmp, "resume.jsonl")
        common = [lib.LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--data-order", "shuffled",
                  *lib.TINY_MODEL, "--train-iters", str(lib.STEPS), "--lr", "3e-3", "--lr-warmup-iters", "3",
                  "--clip-grad", "0.5", "--weight-decay", "0.1", "--log-interval", "1", "--eval-iters", "0",
                  "--threads", "1", "--ddp-bucket-size", "0.01", "--global-batch-size", "8", "--micro-batch-size",
                  "2", *drop, "--save", ck]
        lib.run_ranks(1, common + ["--seed", "7", "--exit-interval", "10"], tag="first 10 steps")
        lib.run_ranks(1, common + ["--seed", "99", "--load", ck, "--metrics", tail], tag="resumed")
        rest = [r["loss"] for r in lib.metrics_rows(tail)]
        check("a run stopped at step 10 and resumed with another --seed takes the checkpoint's seed: steps 11-20 "
              "bit for bit", rest == one[0][10:], f"{rest[:3]} vs {one[0][10:13]}")
        layouts = [
            ("dp2", 2, ["--micro-batch-size", "2"]),
            ("tp2-sp", 2, ["--micro-batch-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
            ("pp2", 2, ["--micro-batch-size", "2", "--pipeline-model-parallel-size", "2"]),
            ("zero3-np2", 2, ["--micro-batch-size", "2", "--zero-stage", "3"]),
            ("cp2-p2p", 2, ["--micro-batch-size", "2", "--context-parallel-size", "2", "--cp-comm-type", "p2p"]),
            ("cp2-a2a", 2, ["--micro-batch-size", "2", "--context-parallel-size", "2", "--cp-comm-type", "a2a"]),
        ]
        for tag, n, flags in layouts:
            lib.compare_runs(f"dropout {tag}", one, lib.tiny_run(tmp, tag, n, ["--global-batch-size", "8", *flags,
                                                                                *drop]))
        inv = ["--layout-invariant", "2"]
        one_inv = lib.tiny_run(tmp, "one-inv", 1, ["--global-batch-size", "8", "--micro-batch-size", "2", *drop,
                                                   *inv])
        for tag, n, flags in layouts[:4]:
            lib.same_run(f"dropout {tag} --layout-invariant 2", one_inv,
                         lib.tiny_run(tmp, tag + "-inv", n, ["--global-batch-size", "8", *flags, *drop, *inv]))

        # ---- bad settings ----
        base = ["train", "--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL, "--train-iters", "1"]
        for name, extra, needles in [
            ("p of 1", ["--hidden-dropout", "1"], ["--hidden-dropout", "below 1"]),
            ("p below 0", ["--embedding-dropout", "-0.5"], ["--embedding-dropout"]),
            ("attention dropout, unfused attention", ["--attention-dropout", "0.1", "--attention-backend", "unfused"],
             ["--attention-dropout", "unfused"]),
        ]:
            lib.check_refused(f"refused: {name}", lib.loom(*base, *extra), needles)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
