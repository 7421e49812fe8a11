"""What --layout-invariant costs: GPT-2 124M in bf16, the same global batch,
each layout with and without the flag, alternated in one run (fresh
processes, A B A B ...): one process with 2 threads, and TP 2 x 1 thread,
each with 4 micro-batches a step (the micro-batch tree) and the split
products in 2 pieces. The flag's runs must agree bit for bit. Prints each pair's median tokens/s, the ratio, and the peak
per-rank memory by loom's accounting (gradients: the tree's levels).

    make && /usr/bin/python3 bench/layout_invariant.py [--quick] [--seq-length T] [--batch G]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import ENV, LOOM, MB
from pyref import shard

import numpy as np

INV = ["--layout-invariant", "2"]


def layouts(G):
    mbs = ["--micro-batch-size", str(max(G // 4, 1))]  # the same micro-batches: the same bits under the flag
    one = ["--threads", "2"] + mbs
    tp2 = ["--threads", "1", "--tensor-model-parallel-size", "2"] + mbs
    return {"1 process": (1, one), "1 process, invariant": (1, one + INV),
            "TP 2": (2, tp2), "TP 2, invariant": (2, tp2 + INV)}


def run(tmp, n, extra, T, G, steps):
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [LOOM, "train", "--model", "gpt2", "--bf16", "--seq-length", str(T), "--data-path",
           os.path.join(tmp, "train.bin"), "--global-batch-size", str(G), "--train-iters", str(steps),
           "--log-interval", "1", "--eval-iters", "0", "--metrics", metrics] + extra
    if n > 1:
        cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode:
        sys.exit(f"{' '.join(extra)} failed: {p.stderr[-1500:]}")
    rows = [json.loads(line) for line in open(metrics) if '"loss"' in line]
    mem = rows[-1].get("mem_by_rank") or [rows[-1]["mem"]]
    return [r["tokens_per_s"] for r in rows[1:]], [r["loss"] for r in rows], mem  # the first step warms up


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one round, fewer steps")
    ap.add_argument("--seq-length", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    a = ap.parse_args()
    rounds, steps = (1, 3) if a.quick else (3, 4)
    L = layouts(a.batch)
    tps, mem, losses = {k: [] for k in L}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, 400000))
        for _ in range(rounds):
            for name, (n, extra) in L.items():
                t, losses[name], mem[name] = run(tmp, n, extra, a.seq_length, a.batch, steps)
                tps[name].append(statistics.median(t))
    print(f"GPT-2 124M, bf16, T={a.seq_length}, global batch {a.batch}, {rounds} rounds alternated, medians")
    print(f"{'layout':22s} {'tokens/s':>9s} {'ratio':>6s}   per-rank peak MiB: params grads optimizer activations "
          "comm total")
    for name in L:
        t = statistics.median(tps[name])
        base = statistics.median(tps[name.replace(", invariant", "")])
        m = mem[name][0]
        cols = " ".join(f"{m.get(k, 0) / MB:7.1f}" for k in ("params", "grads", "optimizer", "activations", "comm",
                                                              "total"))
        print(f"{name:22s} {t:9.0f} {t / base:6.2f}   {cols}")
    same = losses["1 process, invariant"] == losses["TP 2, invariant"]
    print(f"losses of the invariant runs: one process and TP 2 {'bit for bit equal' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
