#!/usr/bin/env python3
"""Training throughput of loom against PyTorch on GPT-2 124M (CPU).

For each shape (B=4,T=64 and B=8,T=256 by default) the runs alternate
loom, PyTorch, PyTorch with OPENBLAS_CORETYPE, loom, PyTorch, ... so slow
drifts of the machine (frequency, other load) hit every column alike. Each
run is a fresh process training a few steps on a shard of random tokens; the
first step of each run (allocation, page faults, warm-up) is dropped and the
tokens/s of the rest are pooled. Prints each column's median, loom/PyTorch,
and loom's MFU (from its metrics file).

    bench/throughput.py [--quick] [--only B,T] [--rounds N]

See bench/README.md for what the columns mean.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

BUILD = os.environ.get("BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
LOOM = os.path.join(BUILD, "loom")
PYTHON = os.environ.get("PYTHON", sys.executable)

V, C, L, NH, MAXT = 50257, 768, 12, 12, 1024
THREADS = 2
# OpenBLAS core names, to pick the one loom reports out of its start-up lines
CORES = ["SapphireRapids", "Cooperlake", "SkylakeX", "Haswell", "Zen", "Sandybridge", "Nehalem", "Core2",
         "Penryn", "Prescott", "Atom", "Dunnington", "Bulldozer", "Piledriver", "Steamroller", "Excavator"]


# ---- the PyTorch side, run in a child process so OPENBLAS_CORETYPE applies ----

def torch_worker(B, T, steps):
    import torch
    from pyref import gpt2

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model = gpt2.init_weights(gpt2.GPT2(gpt2.Config(L, C, NH, V, MAXT)), 0)
    opt = torch.optim.AdamW(gpt2.decay_groups(model, 0.1), lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps):
        x = torch.randint(0, V, (B, T + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    core = ""
    try:
        import ctypes
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        pass
    print(json.dumps({"tokens_per_s": [B * T / t for t in times], "core": core}))


def run_torch(B, T, steps, coretype):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    # -P: bench/ stays off the import path (its tokenize.py would hide the standard library's)
    p = subprocess.run([PYTHON, "-P", os.path.abspath(__file__), "--torch-worker", f"{B},{T},{steps}"],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"throughput: PyTorch run failed:\n{p.stderr[-2000:]}")
    d = json.loads(p.stdout.strip().splitlines()[-1])
    return d["tokens_per_s"][1:], [], d["core"]


# ---- the loom side ----

def run_loom(B, T, steps, shard_path, tmp):
    metrics = os.path.join(tmp, f"m_{B}_{T}_{time.monotonic_ns()}.jsonl")
    args = [LOOM, "train", "--model", "gpt2", "--seq-length", T, "--micro-batch-size", B, "--train-iters", steps,
            "--data-path", shard_path, "--threads", THREADS, "--log-interval", 1, "--eval-iters", 0,
            "--metrics", metrics]
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"throughput: loom failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    with open(metrics) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    rows = [r for r in rows if "tokens_per_s" in r and r["step"] > 1]
    return [r["tokens_per_s"] for r in rows], [r["mfu"] for r in rows], blas_core(p.stdout + p.stderr)


def blas_core(text):
    """The OpenBLAS core named on a start-up line that mentions BLAS."""
    for line in text.splitlines():
        if "blas" in line.lower():
            for c in CORES:
                if re.search(r"\b" + c + r"\b", line, re.IGNORECASE):
                    return c
    return ""


def core_from_cpu_flags():
    """What loom selects when it does not say: SkylakeX with AVX-512, else
    Haswell with AVX2 and FMA (src/base/blas_env.c)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return ""
    if all(x in flags for x in ("avx512f", "avx512bw", "avx512vl", "avx512dq")):
        return "SkylakeX"
    if "avx2" in flags and "fma" in flags:
        return "Haswell"
    return ""


def write_shard(path, n):
    import numpy as np
    from pyref import shard
    shard.write(path, np.random.default_rng(0).integers(0, V, size=n))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round, fewer steps")
    ap.add_argument("--only", metavar="B,T", help="run one shape only, e.g. 4,64")
    ap.add_argument("--rounds", type=int, help="rounds per shape (default 2, 1 with --quick)")
    ap.add_argument("--torch-worker", metavar="B,T,STEPS", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        B, T, steps = (int(x) for x in a.torch_worker.split(","))
        torch_worker(B, T, steps)
        return 0
    if not os.access(LOOM, os.X_OK):
        sys.exit(f"throughput: {LOOM} not built (run make)")
    # (B, T, steps per run including the dropped first one)
    # A PyTorch step at B=8,T=256 takes about a minute with the misdetected
    # core, which is what bounds the step counts (whole run under ~15 min).
    shapes = [(4, 64, 4), (8, 256, 2)]
    if a.quick:
        shapes = [(4, 64, 3), (8, 256, 2)]
    if a.only:
        try:
            B, T = (int(x) for x in a.only.split(","))
        except ValueError:
            sys.exit("throughput: --only takes B,T, e.g. --only 4,64")
        known = {(b, t): s for b, t, s in shapes}
        shapes = [(B, T, known.get((B, T), 3 if a.quick else 4))]
    rounds = a.rounds or (1 if a.quick else 2)
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.2f} before start: other work shares the CPUs, figures are lower"
              " than on an idle machine (the alternation keeps the comparison fair)", flush=True)

    t_start = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        shard_path = os.path.join(tmp, "random.bin")
        write_shard(shard_path, max(b * t * s for b, t, s in shapes) * 2 + 1)
        loom_core = ""
        for B, T, steps in shapes:
            cols = {"loom": [], "pytorch": [], "pytorch+core": []}
            per_round = {k: [] for k in cols}
            mfus = []
            torch_core = core_used = ""
            print(f"B={B} T={T}: {rounds} round(s) of {steps} steps per run (first dropped)", flush=True)
            for r in range(rounds):
                tps, mfu, core = run_loom(B, T, steps, shard_path, tmp)
                loom_core = loom_core or core
                if not loom_core:
                    loom_core = core_from_cpu_flags()
                    if loom_core:
                        print(f"  (loom did not print its BLAS core; from the CPU flags it selects {loom_core})")
                cols["loom"] += tps
                per_round["loom"].append(med(tps))
                mfus += mfu
                tps, _, torch_core = run_torch(B, T, steps, None)
                cols["pytorch"] += tps
                per_round["pytorch"].append(med(tps))
                tps, _, core_used = run_torch(B, T, steps, loom_core)
                cols["pytorch+core"] += tps
                per_round["pytorch+core"].append(med(tps))
                print(f"  round {r + 1}: loom {per_round['loom'][-1]:.0f} | pytorch {per_round['pytorch'][-1]:.0f}"
                      f" | pytorch OPENBLAS_CORETYPE={loom_core} {per_round['pytorch+core'][-1]:.0f} tokens/s",
                      flush=True)
            results.append((B, T, cols, per_round, mfus, torch_core, core_used))

    print()
    print(f"GPT-2 124M, float32, AdamW, {THREADS} threads; tokens/s (median over steps after the first)")
    print(f"loom's OpenBLAS core: {loom_core or 'unknown'}")
    hdr = f"{'B':>3} {'T':>4} | {'loom':>8} | {'pytorch':>8} {'(core)':>10} | {'pytorch':>8} {'(core)':>10}" \
          f" | {'loom/pt':>7} {'loom/pt*':>8} | {'loom mfu':>8}"
    print(hdr)
    print("-" * len(hdr))
    for B, T, cols, per_round, mfus, torch_core, core_used in results:
        lm, pt, pc = med(cols["loom"]), med(cols["pytorch"]), med(cols["pytorch+core"])
        print(f"{B:>3} {T:>4} | {lm:8.0f} | {pt:8.0f} {torch_core:>10} | {pc:8.0f} {core_used:>10}"
              f" | {lm / pt:7.2f} {lm / pc:8.2f} | {100 * med(mfus):7.1f}%")
    print("loom/pt: against PyTorch as installed; loom/pt*: against PyTorch with "
          "OPENBLAS_CORETYPE set to loom's core")
    print(f"total time {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
