"""Fused causal attention, forward + backward: loom's kernels against PyTorch's CPU
scaled_dot_product_attention, float32 and bf16 on both sides.

    make && /usr/bin/python3 bench/attention.py [--rounds 2] [--repeats 3] [--T 1024,4096,8192]
        [--dtype f32,bf16]

B=1, 12 heads of 64, causal, 2 threads (OMP_NUM_THREADS=2 for loom,
torch.set_num_threads(2)). loom is build/tests/tools/flash_bench on the
decoder's packed qkv (B,T,3C) (flash_attention_forward/backward; under bf16
the bf16 forms on the units the CPU has); PyTorch is PyTorch 2.x from PyPI
in its own virtual environment (build/bench-torch2, as bench/bf16.py makes
it), F.scaled_dot_product_attention(q, k, v, is_causal=True) on (B,NH,T,hs)
tensors of the dtype and .backward(dO), timed with time.perf_counter.

Each (T, dtype) point alternates loom, PyTorch, loom, PyTorch, ... (rounds
of fresh processes); each process times `repeats` forward + backward passes
after a warm-up one, and the medians are over every round's passes. At
T=1024 the tool also times loom's dense kernels (which store (B,NH,T,T))
in the same process, alternating with the fused ones.

GFLOP/s count causal attention as FlashAttention counts it: the forward
4 T^2 hs NH B / 2 (two products, half the pairs), the backward 2.5 times
that (five products), 7 T^2 hs NH B in all. Peak: loom's calibration (a
1024^3 product of the dtype on the same 2 threads, best of a few runs),
which every loom process makes; the table takes the best of all of them
for each dtype, the one least disturbed by other work.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
TOOL = os.path.join(BUILD, "tests", "tools", "flash_bench")

B, NH, HS, THREADS = 1, 12, 64, 2


def flops(T):
    return 7.0 * T * T * HS * NH * B


# ---- the PyTorch side (runs under the venv's python) ----

def torch_worker(T, dtype, repeats):
    import time

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    dt = torch.float32 if dtype == "f32" else torch.bfloat16
    q, k, v = (torch.empty(B, NH, T, HS).uniform_(-1, 1).to(dt).requires_grad_() for _ in range(3))
    do = torch.empty(B, NH, T, HS).uniform_(-1, 1).to(dt)
    for r in range(repeats + 1):
        for x in (q, k, v):
            x.grad = None
        t0 = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        t1 = time.perf_counter()
        o.backward(do)
        t2 = time.perf_counter()
        if r:
            print(f"rep {r} ms {(t2 - t0) * 1e3:.3f} fwd {(t1 - t0) * 1e3:.3f} bwd {(t2 - t1) * 1e3:.3f}",
                  flush=True)


def run_torch(py, T, dtype, repeats):
    # -P: bench/ (whose tokenize.py would shadow the standard library's) stays off the worker's path
    p = subprocess.run([py, "-P", __file__, "--worker", str(T), dtype, str(repeats)], capture_output=True,
                       text=True)
    if p.returncode:
        sys.exit(f"attention: PyTorch worker failed: {p.stderr.strip()[-2000:]}")
    ms = [float(line.split()[3]) for line in p.stdout.splitlines() if line.startswith("rep")]
    return ms


def run_loom(T, dtype, repeats, dense):
    cmd = [TOOL, "--B", str(B), "--T", str(T), "--NH", str(NH), "--hs", str(HS), "--repeats", str(repeats),
           "--dtype", dtype, "--dense", "1" if dense else "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(THREADS)))
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    res = {"fused": [], "dense": []}
    for line in p.stdout.splitlines():
        f = line.split()
        if f[0] == "rep":
            res["fused"].append(float(f[3]))
            if dense:
                res["dense"].append(float(f[5]))
        elif f[0] == "fused":
            res["units"] = f[8]
        elif f[0] == "peak_gflops":
            res["peak"] = float(f[1])
    return res


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        torch_worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--T", default="1024,4096,8192")
    ap.add_argument("--dtype", default="f32,bf16")
    a = ap.parse_args()
    if not os.access(TOOL, os.X_OK):
        sys.exit(f"attention: {TOOL} not built (make)")
    sys.path.insert(0, HERE)
    import bf16 as torch2  # its PyTorch 2.x environment

    version = torch2.ensure_torch2()
    load = os.getloadavg()[0]
    print(f"PyTorch {version}; B={B} NH={NH} hs={HS} causal, {THREADS} threads; load average {load:.2f}"
          + (" (other work is running: absolute figures drop, the alternation keeps ratios fair)"
             if load > 0.5 else ""), flush=True)
    rows = []
    for dtype in a.dtype.split(","):
        for T in (int(t) for t in a.T.split(",")):
            loom, pt, dense, peaks, units = [], [], [], [], ""
            for r in range(a.rounds):
                lr = run_loom(T, dtype, a.repeats, dense=(T == 1024))
                loom += lr["fused"]
                dense += lr["dense"]
                peaks.append(lr["peak"])
                units = lr["units"]
                pt += run_torch(torch2.PY, T, dtype, a.repeats)
                print(f"  {dtype} T={T} round {r + 1}: loom {statistics.median(lr['fused']):.1f} ms, "
                      f"PyTorch {statistics.median(pt[-a.repeats:]):.1f} ms", flush=True)
            lm, pm = statistics.median(loom), statistics.median(pt)
            rows.append((dtype, units, T, lm, pm, max(peaks), statistics.median(dense) if dense else None))
    print()
    print("| dtype | T | loom ms | PyTorch ms | PyTorch/loom | loom GFLOP/s | PyTorch GFLOP/s | loom % of peak"
          " | peak GFLOP/s | dense (T,T) kernels ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    best = {}
    for dtype, _, _, _, _, peak, _ in rows:
        best[dtype] = max(best.get(dtype, 0.0), peak)
    for dtype, units, T, lm, pm, _, dm in rows:
        peak = best[dtype]
        lg, pg = flops(T) / lm / 1e6, flops(T) / pm / 1e6
        print(f"| {dtype} ({units}) | {T} | {lm:.1f} | {pm:.1f} | {pm / lm:.2f}x | {lg:.1f} | {pg:.1f} | "
              f"{100 * lg / peak:.0f}% | {peak:.0f} | {'' if dm is None else f'{dm:.1f}'} |")


if __name__ == "__main__":
    main()
