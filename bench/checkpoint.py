"""Checkpoint save and load speed for GPT-2 124M, next to a plain copy of the
same bytes on the same disk, in one run.

    make && /usr/bin/python3 bench/checkpoint.py [--rounds N] [--ranks N] [--dir DIR]

One checkpoint of GPT-2 124M is 1.49 GB: weights and both AdamW moments in
float32. Each round, alternating:
- save: `loom train --model gpt2 --train-iters 1 --save S` (with --ranks N,
  under mpirun: each rank writes its share); loom prints the bytes rank 0
  wrote and the seconds the whole collective save took (writing, checksums,
  fsync of every file, renames and directory fsyncs);
- copy: the same bytes (the checkpoint's rank files) copied with
  `cp` to a new file and fsynced (`sync -f`), timed from outside;
- load: `loom train --load S --train-iters 1`, which restores and has
  nothing left to train; loom prints the bytes rank 0 read and the seconds
  (mapping, checking every checksum, assembling the weights and moments).
Throughput is bytes / seconds for all ranks together. The page cache is
warm for all three (the machine does not let a benchmark drop it), so the
copy reads from memory as loom's save does, and the load reads from memory
as the copy's read side does. Ratios are medians over the rounds.

On a virtual machine the first touch of guest memory the host has not
backed yet is slow, and whichever writer gets such pages for its page cache
runs at a fraction of the speed (measured here: 370 to 1500 MB/s for the same
write). So before each timed operation a helper process touches and frees
memory for loom's process and the page cache of the checkpoint (3.3x its
size), and the order of save and copy alternates between rounds. loom runs
with its default threads (all cores), as in training.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from pyref import shard  # noqa: E402

import numpy as np  # noqa: E402

LOOM = os.path.join(HERE, "..", os.environ.get("BUILD", "build"), "loom")
# PMIX_MCA_psec: see tests/lib.py (a stale munge socket: 2.3 s a launch)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           PMIX_MCA_psec=os.environ.get("PMIX_MCA_psec", "native"))


def loom(ranks, args):
    cmd = [LOOM, "train", "--model", "gpt2", "--seq-length", "64", "--micro-batch-size", "1",
           "--global-batch-size", str(ranks), "--train-iters", "1", "--eval-iters", "0"] + args
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode:
        sys.exit(f"loom failed: {p.stderr[-1500:]}")
    return p.stdout


def warm_memory(nbytes):
    """Touch and free nbytes of memory, so the next writer's page cache gets backed pages."""
    subprocess.run([sys.executable, "-c", f"import numpy as np; np.ones({int(nbytes) // 8}).sum()"], check=True)


def seconds(out, what):
    m = re.search(what + r".* in ([0-9.]+) s", out)
    if not m:
        sys.exit(f"no '{what}' line in:\n{out[-1500:]}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary directory)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(dir=a.dir)
    try:
        data = os.path.join(tmp, "train.bin")
        shard.write(data, np.random.default_rng(0).integers(0, 50257, 200000, dtype=np.uint16))
        save = os.path.join(tmp, "save")
        rows = []
        ckpt_bytes = 124.5e6 * 12  # weights and two moments, float32
        for r in range(a.rounds):
            def save_once():
                shutil.rmtree(save, ignore_errors=True)
                warm_memory(3.3 * ckpt_bytes)
                return seconds(loom(a.ranks, ["--data-path", data, "--save", save]), "saved checkpoint")

            def copy_once():
                it = os.path.join(save, open(os.path.join(save, "latest")).read().strip())
                files = [os.path.join(it, f) for f in sorted(os.listdir(it)) if f.endswith(".safetensors")]
                warm_memory(3.3 * ckpt_bytes)
                t0 = time.perf_counter()
                for i, f in enumerate(files):
                    dst = os.path.join(tmp, f"copy{i}")
                    subprocess.run(["cp", f, dst], check=True)
                    subprocess.run(["sync", "-f", dst], check=True)
                t = time.perf_counter() - t0
                for i in range(len(files)):
                    os.remove(os.path.join(tmp, f"copy{i}"))
                return t, sum(os.path.getsize(f) for f in files)

            if r % 2 == 0 or not os.path.exists(save):
                t_save = save_once()
                t_copy, nbytes = copy_once()
            else:
                t_copy, nbytes = copy_once()
                t_save = save_once()
            warm_memory(3.3 * ckpt_bytes)
            out = loom(a.ranks, ["--data-path", data, "--load", save])
            t_load = seconds(out, "resumed at step")
            row = (nbytes / t_save / 1e6, nbytes / t_copy / 1e6, nbytes / t_load / 1e6)
            rows.append(row)
            print(f"round {r + 1}: {nbytes / 1e9:.2f} GB | save {row[0]:.0f} MB/s | copy {row[1]:.0f} MB/s | "
                  f"load {row[2]:.0f} MB/s | save/copy {row[0] / row[1]:.2f} | load/copy {row[2] / row[1]:.2f}",
                  flush=True)
        med = [statistics.median(x) for x in zip(*rows)]
        print(f"\nmedian over {a.rounds} rounds, {a.ranks} rank(s): save {med[0]:.0f} MB/s, plain copy {med[1]:.0f} MB/s, "
              f"load {med[2]:.0f} MB/s")
        print(f"save / copy {statistics.median(r[0] / r[1] for r in rows):.2f} (target >= 0.5), "
              f"load / copy {statistics.median(r[2] / r[1] for r in rows):.2f} (target >= 0.5)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
