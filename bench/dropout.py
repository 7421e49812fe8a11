"""What dropout costs: GPT-2 124M in float32 and in bf16, one process, 2
threads, with no dropout and with 0.1 on the hidden, attention and
embedding sites (the masks drawn from a counter hash per element, in the
fused attention's tiles and on the token rows), alternated in one run
(fresh processes, A B A B ...). Prints each setting's median tokens/s
(the first step of each run warms up) and the ratio to no dropout.

    make && /usr/bin/python3 bench/dropout.py [--quick] [--seq-length T] [--batch G]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import ENV, LOOM
from pyref import shard

import numpy as np

DROP = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"]


def run(tmp, extra, T, G, steps):
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [LOOM, "train", "--model", "gpt2", "--seq-length", str(T), "--data-path", os.path.join(tmp, "train.bin"),
           "--global-batch-size", str(G), "--micro-batch-size", str(G), "--train-iters", str(steps),
           "--log-interval", "1", "--eval-iters", "0", "--threads", "2", "--metrics", metrics] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode:
        sys.exit(f"{' '.join(extra)} failed: {p.stderr[-1500:]}")
    rows = [json.loads(line) for line in open(metrics) if '"loss"' in line]
    return [r["tokens_per_s"] for r in rows[1:]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one round, fewer steps")
    ap.add_argument("--seq-length", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2, help="global batch (sequences)")
    a = ap.parse_args()
    rounds, steps = (1, 3) if a.quick else (3, 4)
    settings = {"float32": [], "float32, dropout 0.1": DROP, "bf16": ["--bf16"], "bf16, dropout 0.1": ["--bf16"] + DROP}
    tps = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, 400000))
        for _ in range(rounds):
            for name, extra in settings.items():
                tps[name].append(statistics.median(run(tmp, extra, a.seq_length, a.batch, steps)))
    print(f"GPT-2 124M, one process x 2 threads, T={a.seq_length}, batch {a.batch}, {rounds} rounds alternated, medians")
    for name in settings:
        t = statistics.median(tps[name])
        base = statistics.median(tps[name.replace(", dropout 0.1", "")])
        print(f"{name:22s} {t:9.0f} tokens/s {t / base:6.3f}")


if __name__ == "__main__":
    main()
