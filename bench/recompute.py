"""Activation recomputation on GPT-2 124M: activation memory against step
time. Runs `loom train --model gpt2` at B=4, T=256 (by default) on 2 threads
with no recomputation, selective (--recompute-activations) and full
(--recompute-granularity full --recompute-method block --recompute-num-layers
12), alternating (A B C A B C, fresh processes); prints the activation bytes
from loom's accounting (the peak of a step, from --metrics) and the median
step time (steps 2..N of every round pooled), each against no recomputation.

    make && /usr/bin/python3 bench/recompute.py [--quick] [--rounds R] [--steps N] [--seq-length T]
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
SETTINGS = {
    "none": [],
    "selective": ["--recompute-activations"],
    "full (block, 12 layers)": ["--recompute-granularity", "full", "--recompute-method", "block",
                                "--recompute-num-layers", "12"],
}
MB = 1e6


def run(tmp, name, flags, B, T, steps):
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [LOOM, "train", "--model", "gpt2", "--micro-batch-size", str(B), "--seq-length", str(T),
           "--train-iters", str(steps), "--eval-iters", "0", "--threads", "2", "--log-interval", "1",
           "--data-path", os.path.join(tmp, "train.bin"), "--metrics", metrics] + flags
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{name} failed: {p.stderr[-1500:]}")
    rows = [json.loads(line) for line in open(metrics) if '"loss"' in line]
    return [r["ms_per_step"] for r in rows[1:]], max(r["mem"]["activations"] for r in rows), rows[-1]["loss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one round of 2 steps (memory only, one timed step)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--seq-length", type=int, default=256)
    a = ap.parse_args()
    rounds, steps = (1, 2) if a.quick else (a.rounds, a.steps)
    B, T = a.micro_batch_size, a.seq_length
    times = {k: [] for k in SETTINGS}
    act, loss = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, 400000))
        for r in range(rounds):
            for name, flags in SETTINGS.items():
                t, act[name], loss[name] = run(tmp, name, flags, B, T, steps)
                times[name] += t
                print(f"round {r + 1} {name}: {statistics.median(t):8.0f} ms/step, activations {act[name]} bytes",
                      flush=True)
    same = len(set(loss.values())) == 1
    print(f"\nGPT-2 124M, B={B}, T={T}, 2 threads; median ms/step over steps 2..{steps} of {rounds} round(s); "
          f"last loss {'identical in all settings' if same else 'DIFFERS: ' + str(loss)}")
    print("| recomputation | activations (bytes) | MB | none / this | ms/step | this / none |")
    print("|---|---|---|---|---|---|")
    base_act, base_t = act["none"], statistics.median(times["none"])
    for name in SETTINGS:
        med = statistics.median(times[name])
        print(f"| {name} | {act[name]} | {act[name] / MB:.0f} | {base_act / act[name]:.2f}x | {med:.0f} | "
              f"{med / base_t:.2f}x |")


if __name__ == "__main__":
    main()
