#!/usr/bin/env python3
"""Two builds of loom side by side: the same runs, alternated A B A B, so a
change's cost is measured against the commit before it on one noisy machine.

Cases: GPT-2 124M in one process with 2 threads (bench/throughput.py's
shapes, B=4,T=64 and B=8,T=256), and DDP and ZeRO stages 1-3 on 2 ranks x 1 thread
(bench/zero.py's layout, global batch 8, T=64). Each run is a fresh process;
its first step is dropped. Prints, per case, each build's median step time
and the median of B/A over the rounds (> 1: B is slower).

    bench/compare.py BUILD_A BUILD_B [--rounds N] [--steps N] [--only NAME]

e.g. build the previous commit in a worktree (`git worktree add /tmp/prev
HEAD~1 && make -C /tmp/prev`), then `bench/compare.py /tmp/prev/build build`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import ENV
from pyref import shard

import numpy as np

CASES = {
    "1proc-B4-T64": (1, ["--micro-batch-size", "4", "--global-batch-size", "4", "--threads", "2"]),
    "1proc-B8-T256": (1, ["--micro-batch-size", "8", "--global-batch-size", "8", "--threads", "2",
                          "--seq-length", "256"]),
    "ddp-2ranks": (2, ["--zero-stage", "0"]),
    "zero1-2ranks": (2, ["--zero-stage", "1"]),
    "zero2-2ranks": (2, ["--zero-stage", "2"]),
    "zero3-2ranks": (2, ["--zero-stage", "3"]),
}


def run(build, tmp, name, steps):
    n, extra = CASES[name]
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [os.path.join(build, "loom"), "train", "--model", "gpt2", "--seq-length", "64", "--train-iters",
           str(steps), "--log-interval", "1", "--eval-iters", "0", "--data-path", os.path.join(tmp, "train.bin"),
           "--metrics", metrics] + extra
    if n > 1:
        cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1"] + cmd + [
            "--global-batch-size", "8", "--micro-batch-size", "4", "--threads", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode:
        sys.exit(f"compare: {build} {name} failed: {p.stderr[-1500:]}")
    rows = [json.loads(x) for x in open(metrics) if '"loss"' in x][1:]
    return statistics.median(r["ms_per_step"] for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", action="append", choices=sorted(CASES))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, size=200000))
        print(f"A = {args.a}\nB = {args.b}\n{args.rounds} rounds of {args.steps} steps, alternated A B")
        print(f"{'case':16} {'A ms/step':>10} {'B ms/step':>10} {'B/A':>7}")
        for name in args.only or CASES:
            a, b, ratios = [], [], []
            for _ in range(args.rounds):
                a.append(run(args.a, tmp, name, args.steps))
                b.append(run(args.b, tmp, name, args.steps))
                ratios.append(b[-1] / a[-1])
            print(f"{name:16} {statistics.median(a):10.1f} {statistics.median(b):10.1f} "
                  f"{statistics.median(ratios):7.3f}   (ratios {', '.join(f'{r:.3f}' for r in ratios)})", flush=True)


if __name__ == "__main__":
    main()
