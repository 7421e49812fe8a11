"""One MoE MLP layer against a dense SwiGLU MLP of the same active products:
forward + backward, loom's decoder layers both.

    make && /usr/bin/python3 bench/moe_layer.py [--rounds 3] [--repeats 3]
        [--shapes 512x512x1024,512x1792x2048,1024x2048x2048] [--E 8] [--k 2]

A shape is CxFxN: C channels, experts of F columns, N rows (tokens of one
micro-batch). The MoE layer is E SwiGLU experts of F, top k (the router,
the dispatch, the experts' products, the combine and their backward, as
decoder_moe.c runs them in training); the dense one is a SwiGLU MLP of
k F columns, the decoder's MLP path: the same products' FLOPs a token
(the router's C x E aside). The issue's bound: the MoE layer at most 1.3x
the dense one.

build/tests/tools/moe_bench builds both as one-layer Llama models with
random weights (the router's at init scale: the experts' rows come out
near balanced; the tool prints the fewest and most rows an expert got)
and times them alternating in one process, a warm-up pass first; each
round is a fresh process, 2 threads (OMP_NUM_THREADS=2). The figures are
the medians over every round's passes.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
TOOL = os.path.join(BUILD, "tests", "tools", "moe_bench")
THREADS = 2


def run(C, F, N, E, k, repeats):
    cmd = [TOOL, "--C", str(C), "--F", str(F), "--N", str(N), "--E", str(E), "--k", str(k), "--repeats",
           str(repeats)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(THREADS)))
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    moe, dense, rows = [], [], None
    for line in p.stdout.splitlines():
        f = line.split()
        if f[0] == "rep":
            moe.append(float(f[3]))
            dense.append(float(f[5]))
        elif f[0] == "rows":
            rows = (int(f[1]), int(f[2]))
    return moe, dense, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", default="512x512x1024,512x1792x2048,1024x2048x2048")
    ap.add_argument("--E", type=int, default=8)
    ap.add_argument("--k", type=int, default=2)
    a = ap.parse_args()
    if not os.access(TOOL, os.X_OK):
        sys.exit(f"moe_layer: {TOOL} not built (make)")
    load = os.getloadavg()[0]
    print(f"top {a.k} of {a.E} SwiGLU experts against a dense SwiGLU of {a.k} F, {THREADS} threads; load average "
          f"{load:.2f}" + (" (other work is running: the alternation keeps ratios fair)" if load > 0.5 else ""),
          flush=True)
    rows = []
    for shape in a.shapes.split(","):
        C, F, N = (int(x) for x in shape.split("x"))
        moe, dense, got = [], [], None
        for r in range(a.rounds):
            m, d, got = run(C, F, N, a.E, a.k, a.repeats)
            moe += m
            dense += d
            print(f"  C={C} F={F} N={N} round {r + 1}: MoE {statistics.median(m):.1f} ms, dense "
                  f"{statistics.median(d):.1f} ms", flush=True)
        mm, dm = statistics.median(moe), statistics.median(dense)
        gflop = 18.0 * N * C * a.k * F / 1e9  # three products of k F columns, forward and twice that backward
        rows.append((C, F, N, got, mm, dm, gflop))
    print()
    print("| C | F | N | rows an expert (min-max) | MoE ms | dense ms | MoE / dense | dense GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for C, F, N, got, mm, dm, gflop in rows:
        print(f"| {C} | {F} | {N} | {got[0]}-{got[1]} | {mm:.1f} | {dm:.1f} | {mm / dm:.2f}x | "
              f"{gflop / (dm / 1e3):.0f} |")


if __name__ == "__main__":
    main()
