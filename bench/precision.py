"""Training throughput of GPT-2 124M in float32, bf16, fp16 and fp8 (hybrid,
on bf16), side by side.

    make && /usr/bin/python3 bench/precision.py [--rounds N] [--seq-length T] [--micro-batch-size B]

Runs alternate fp32, bf16, fp16, fp32, ... (fresh processes, the same data
and settings, all threads); the first step of each run is dropped and the
remaining steps of all rounds are pooled into one median tokens/s per
precision. On the CPU backend the kernels compute in float32 under every
precision, so mixed precision costs the conversions (parameters to float32
per block and use, gradients back, activations rounded at kernel edges) and
saves memory, not time. fp16's first steps overflow at the initial loss
scale; the benchmark starts it at 2^12 so that it trains from the start.
fp8 has no units of its own on a CPU: its products run on the bf16 units
(every fp8 value is a bf16 value), so it costs bf16's time plus the
quantisation of every operand at every use.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from pyref import shard  # noqa: E402

import numpy as np  # noqa: E402

LOOM = os.path.join(HERE, "..", os.environ.get("BUILD", "build"), "loom")
MODES = {"fp32": [], "bf16": ["--bf16"], "fp16": ["--fp16", "--initial-loss-scale", "4096"],
         "fp8": ["--bf16", "--fp8-format", "hybrid"]}


def run(tmp, mode, T, B, steps):
    metrics = os.path.join(tmp, f"{mode}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [LOOM, "train", "--model", "gpt2", "--seq-length", str(T), "--micro-batch-size", str(B),
           "--train-iters", str(steps), "--log-interval", "1", "--eval-iters", "0", "--metrics", metrics,
           "--data-path", os.path.join(tmp, "train.bin")] + MODES[mode]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{mode} failed: {p.stderr[-1500:]}")
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    return [r["tokens_per_s"] for r in rows[1:]], rows[-1]["mem"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq-length", type=int, default=64)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, 200000, dtype=np.uint16))
        tps = {m: [] for m in MODES}
        mem = {}
        for r in range(a.rounds):
            for m in MODES:
                got, mem[m] = run(tmp, m, a.seq_length, a.micro_batch_size, a.steps)
                tps[m] += got
                print(f"round {r + 1} {m}: median {statistics.median(got):.0f} tokens/s", flush=True)
        base = statistics.median(tps["fp32"])
        print(f"\nGPT-2 124M, B={a.micro_batch_size}, T={a.seq_length}, {a.rounds} rounds:")
        print(f"{'precision':>9} {'tokens/s':>9} {'vs fp32':>8} {'params':>9} {'grads':>9} {'optimizer':>10} {'activations':>12}")
        for m in MODES:
            med = statistics.median(tps[m])
            print(f"{m:>9} {med:9.0f} {med / base:8.2f} {mem[m]['params'] / 1e6:8.0f}M {mem[m]['grads'] / 1e6:8.0f}M"
                  f" {mem[m]['optimizer'] / 1e6:9.0f}M {mem[m]['activations'] / 1e6:11.0f}M")


if __name__ == "__main__":
    main()
