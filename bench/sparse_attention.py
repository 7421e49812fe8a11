"""Block-sparse causal attention against dense: time of one forward and
backward and the bytes of the saved probabilities (att), at B=1, T=4096,
C=256, NH=4 by default, for a token window of 256 (block 64) and for
bslongformer, bigbird and fixed layouts of block 64 at comparable density.

Each layout is one run of build/tests/tools/attn_bench, which alternates
dense and sparse (A B A B, a warm-up pair first) in one process; rounds
repeat every layout. The table gives the medians of all rounds and the
dense/sparse ratios of time and memory. OpenMP threads: OMP_NUM_THREADS
(2 by default here).

    make && /usr/bin/python3 bench/sparse_attention.py [--rounds 2] [--repeats 5] [--T 4096]
        [--only window,bslongformer,bigbird,fixed]
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", os.environ.get("BUILD", "build"), "tests", "tools", "attn_bench")

# name, attn_bench flags (block 64 throughout)
LAYOUTS = [
    ("window 256", ["--mode", "window", "--window", "256"]),
    ("bslongformer", ["--mode", "bslongformer", "--sliding", "7", "--global-indices", "0"]),
    ("bigbird", ["--mode", "bigbird", "--random", "1", "--sliding", "7", "--global", "1"]),
    ("fixed", ["--mode", "fixed", "--local", "8", "--global", "1"]),
]


def describe(flags):
    out = []
    for k, v in zip(flags[2::2], flags[3::2]):
        out.append(f"{k.lstrip('-')} {v}")
    return ", ".join(out)


def run(flags, a):
    cmd = [TOOL, "--B", str(a.B), "--T", str(a.T), "--C", str(a.C), "--NH", str(a.NH), "--block", "64",
           "--repeats", str(a.repeats)] + flags
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    res = {"dense": [], "sparse": []}
    for line in p.stdout.splitlines():
        f = line.split()
        if f[0] == "layout":
            res["density"], res["info"] = float(f[7]), line
        elif f[0] == "rep":
            res["dense"].append(float(f[3]))
            res["sparse"].append(float(f[5]))
        elif f[0] in ("dense", "sparse"):
            res[f[0] + "_bytes"] = int(f[4])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="dense/sparse pairs per run")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--C", type=int, default=256)
    ap.add_argument("--NH", type=int, default=4)
    ap.add_argument("--only", default="", help="comma-separated layout names (default: all)")
    a = ap.parse_args()
    layouts = [(n, f) for n, f in LAYOUTS if not a.only or n.split()[0] in a.only.split(",")]
    if not layouts:
        sys.exit(f"--only {a.only}: none of {', '.join(n.split()[0] for n, _ in LAYOUTS)}")
    if not os.access(TOOL, os.X_OK):
        sys.exit(f"{TOOL} not found: run make first")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.2f} at start; the ratios stay fair, the times drop")
    pooled = {name: {"dense": [], "sparse": []} for name, _ in layouts}
    last = {}
    for r in range(a.rounds):
        for name, flags in layouts:
            res = run(flags, a)
            pooled[name]["dense"] += res["dense"]
            pooled[name]["sparse"] += res["sparse"]
            last[name] = res
            print(f"round {r} {name}: dense {statistics.median(res['dense']):.1f} ms, "
                  f"sparse {statistics.median(res['sparse']):.1f} ms")
    print(f"\nB={a.B} T={a.T} C={a.C} NH={a.NH}, forward + backward, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {a.rounds} rounds x {a.repeats} pairs\n")
    print("| layout | settings (block 64) | blocks of the causal ones | dense | sparse | time ratio "
          "| dense att | sparse att | memory ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, flags in layouts:
        d, s = statistics.median(pooled[name]["dense"]), statistics.median(pooled[name]["sparse"])
        db, sb = last[name]["dense_bytes"], last[name]["sparse_bytes"]
        print(f"| {name} | {describe(flags)} | {100 * last[name]['density']:.1f}% | {d:.1f} ms | {s:.1f} ms "
              f"| {d / s:.2f}x | {db / 2**20:.1f} MiB | {sb / 2**20:.1f} MiB | {db / sb:.2f}x |")


if __name__ == "__main__":
    main()
