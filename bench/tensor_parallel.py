"""Tensor parallelism against one process and DDP on one machine: GPT-2 124M,
the same global batch, in one run. Layouts alternate (fresh processes,
A B C A B C ...): one process with 2 threads, DDP on 2 ranks x 1 thread, TP 2
x 1 thread (and TP 2 with --sequence-parallel when this build has it).
Prints each layout's median tokens/s and its ratio to one process, the
exposed communication per step (the wait after the backward; TP's
all-reduces inside the layers are compute-blocking and show in the step
time instead), and per-rank memory by loom's accounting.

    make && /usr/bin/python3 bench/tensor_parallel.py [--quick] [--seq-length T] [--batch G]
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


def layouts():
    out = {"1 process": (1, ["--threads", "2"]), "DP 2": (2, ["--threads", "1"]),
           "TP 2": (2, ["--threads", "1", "--tensor-model-parallel-size", "2"])}
    p = subprocess.run([LOOM, "train", "--help"], capture_output=True, text=True)
    if "--sequence-parallel" in p.stdout:
        out["TP 2 + SP"] = (2, ["--threads", "1", "--tensor-model-parallel-size", "2", "--sequence-parallel"])
    return out


def run(tmp, name, n, extra, T, G, steps):
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [LOOM, "train", "--model", "gpt2", "--seq-length", str(T), "--data-path", os.path.join(tmp, "train.bin"),
           "--global-batch-size", str(G), "--micro-batch-size", str(G // (2 if name == "DP 2" else 1)),
           "--train-iters", str(steps), "--log-interval", "1", "--eval-iters", "0", "--metrics", metrics] + extra
    if n > 1:
        cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode:
        sys.exit(f"{name} failed: {p.stderr[-1500:]}")
    rows = [json.loads(line) for line in open(metrics) if '"loss"' in line][1:]  # the first step warms up
    mem = rows[-1].get("mem_by_rank") or [rows[-1]["mem"]]
    return [r["tokens_per_s"] for r in rows], [r.get("comm_wait_ms", 0.0) for r in rows], mem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one round, fewer steps")
    ap.add_argument("--seq-length", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    a = ap.parse_args()
    rounds, steps = (1, 3) if a.quick else (3, 4)
    L = layouts()
    tps = {k: [] for k in L}
    wait = {k: [] for k in L}
    mem = {}
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, 400000))
        for _ in range(rounds):
            for name, (n, extra) in L.items():
                t, w, mem[name] = run(tmp, name, n, extra, a.seq_length, a.batch, steps)
                tps[name].append(statistics.median(t))
                wait[name].append(statistics.median(w))
    base = statistics.median(tps["1 process"])
    print(f"GPT-2 124M, T={a.seq_length}, global batch {a.batch}, {rounds} rounds alternated, medians")
    print(f"{'layout':12s} {'tokens/s':>9s} {'vs 1 proc':>9s} {'exposed comm ms':>16s}   per-rank MiB: "
          "params grads optimizer activations comm total")
    for name in L:
        m = statistics.median(tps[name])
        per = "; ".join(f"{r['params'] / MB:.0f} {r['grads'] / MB:.0f} {r['optimizer'] / MB:.0f} "
                        f"{r['activations'] / MB:.0f} {r['comm'] / MB:.0f} {r['total'] / MB:.0f}" for r in mem[name])
        print(f"{name:12s} {m:9.0f} {m / base:9.2f} {statistics.median(wait[name]):16.1f}   {per}")


if __name__ == "__main__":
    main()
