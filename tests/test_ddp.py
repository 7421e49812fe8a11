"""Data parallelism keeps the math: `mpirun -np N loom train` with global
batch G gives the per-step loss of the single-process run with global batch
G (reached through accumulation), and the same final weights.

Cases: N = 2 and 4 (oversubscribed on 2 cores), without and with
accumulation on each rank, bucketed with overlap, bucketed without overlap,
and the naive one-all-reduce reference. Buckets are made small so the tiny
model spans several of them and overlap really happens.

Tolerance 1e-5 relative: ranks sum partial gradients in a different order
than one process accumulating micro-batches, so results agree to float32
rounding, not bit for bit.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from pyref import ckpt  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
LOOM = os.path.join(BUILD, "loom")
TOL = 1e-5
STEPS = 20
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_mpi_yield_when_idle="1")

failures = 0


def check(name, cond, detail=""):
    """One line per check; a failed one counts toward this module's failures."""
    global failures
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + (f": {detail}" if detail and not cond else ""))
    failures += 0 if cond else 1


def write_corpus(tmp):
    """The built-in corpus as tmp/train.bin: gradients carry signal, not just noise (see compare)."""
    subprocess.run([LOOM, "data", "synth", os.path.join(tmp, "corpus"), "--tokens", "200000"], check=True,
                   capture_output=True)
    os.rename(os.path.join(tmp, "corpus", "train.bin"), os.path.join(tmp, "train.bin"))


def run(tmp, tag, np_ranks, extra):
    metrics = os.path.join(tmp, f"{tag}.jsonl")
    save = os.path.join(tmp, tag)
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--data-order", "shuffled",
           "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
           "--max-position-embeddings", "16", "--vocab-size", "256", "--train-iters", str(STEPS),
           "--lr", "3e-3", "--lr-warmup-iters", "3", "--clip-grad", "0.5", "--weight-decay", "0.1",
           "--log-interval", "1", "--eval-iters", "0", "--threads", "1", "--seed", "7",
           "--metrics", metrics, "--save", save, "--ddp-bucket-size", "0.01", "--comm-timeout", "60"] + extra
    if np_ranks > 1:
        cmd = ["mpirun", "-np", str(np_ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"{tag}: exit {p.returncode}\n{p.stderr[-2000:]}")
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    weights = {k: v for k, v in ckpt.assemble(save).items() if not k.startswith("optimizer.")}
    return [r["loss"] for r in rows], weights, p.stdout


def compare(tag, ref, got):
    global failures
    losses_ref, w_ref, _ = ref
    losses, w, out = got
    ok = len(losses) == STEPS
    worst = 0.0
    for a, b in zip(losses, losses_ref):
        worst = max(worst, abs(a - b) / abs(b))
    # Weights: the whole model's relative L2 error, and every tensor's. One
    # slice is left out of the per-tensor check, and said so: the key part of
    # attn.c_attn.bias. Its exact gradient is zero (softmax ignores a shift
    # shared by all keys), so what it holds is float rounding noise that Adam
    # scales up to steps of size lr, different for any summation order; it is
    # reported, and counted in the whole-model error.
    wworst, wname = 0.0, ""
    num = den = 0.0
    for name, ref_t in w_ref.items():
        got_t = w[name].astype(np.float64)
        ref64 = ref_t.astype(np.float64)
        num += float(np.sum((got_t - ref64) ** 2))
        den += float(np.sum(ref64 ** 2))
        if name.endswith("attn.c_attn.bias"):
            c = ref_t.shape[0] // 3
            keep = np.r_[0:c, 2 * c:3 * c]
            got_t, ref64 = got_t[keep], ref64[keep]
        d = np.linalg.norm(got_t - ref64) / max(np.linalg.norm(ref64), 1e-30)
        if d > wworst:
            wworst, wname = d, name
    whole = (num / den) ** 0.5
    wworst = max(wworst, whole)
    ok = ok and worst <= TOL and wworst <= TOL
    buckets = [l for l in out.splitlines() if l.startswith("data parallel")]
    print(f"{'ok  ' if ok else 'FAIL'} {tag:40s} loss max rel err {worst:.2e}, weights rel L2 whole {whole:.2e}, worst tensor {wworst:.2e} ({wname}) "
          f"(tol {TOL:g}) {buckets[0] if buckets else ''}")
    if not ok:
        failures += 1
        for i, (a, b) in enumerate(zip(losses, losses_ref)):
            print(f"    step {i + 1}: {a:.9f} vs {b:.9f}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(tmp)
        # global batch 8 in every case; the reference is one process accumulating micro-batches of 1
        ref8 = run(tmp, "single-G8", 1, ["--global-batch-size", "8", "--micro-batch-size", "1"])
        modes = {"overlap": [], "no-overlap": ["--no-overlap"], "naive": ["--ddp-impl", "naive"]}
        for n in (2, 4):
            for accum in (False, True):
                micro = 8 // n // (2 if accum else 1)
                for mode, flags in modes.items():
                    tag = f"np{n}-micro{micro}-accum{(8 // n) // micro}-{mode}"
                    got = run(tmp, tag, n, ["--global-batch-size", "8", "--micro-batch-size", str(micro)] + flags)
                    compare(tag, ref8, got)
    print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
