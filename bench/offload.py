"""ZeRO-Infinity offload: the step time of full offload (ZeRO-3 with the
parameter and gradient shards and the optimizer state in files) against the
same run in memory, against what the disk allows, and against the
synchronous optimizer offload loom had before (a build of an earlier commit).

    make && /usr/bin/python3 bench/offload.py [--model gpt2-large] [--steps 4] [--rounds 2]
        [--nvme DIR] [--sync-build DIR]

Cases, one process with 2 threads, bf16 (fp32 master weights and moments),
micro-batch 1, T=64, alternated in each round (fresh processes, the first
step of each run dropped, the median of the rest):
- memory: --zero-stage 3, everything in memory;
- offload: --zero-stage 3 --offload-param nvme --offload-optimizer nvme;
- optimizer: --offload-optimizer nvme alone (the asynchronous streaming,
  the like of sync below), and optimizer-direct, the same with O_DIRECT;
- sync (with --sync-build, a build of a commit before the asynchronous
  I/O, e.g. `git worktree add /tmp/sync 033a2a7 && make -C /tmp/sync`):
  --offload-optimizer nvme, the optimizer state streamed with pread/pwrite.

--mem-cap GB runs each case in a memory cgroup of that size (root, cgroup
v1), the page cache dropped first: memory as short as offload is for.

The disk is measured first in the same directory (2 GB written and read
with O_DIRECT, dd). The bytes the offloaded step moves are counted from
the layout: the optimizer's file (m, v and the master weights, read and
written), the parameter shard (read by the gathers and the optimizer,
written by it) and the gradient shard (written as gradients land, read by
the optimizer); the disk-bound time is reads / read bandwidth + writes /
write bandwidth, and the bound the step is held to is max(memory step,
disk-bound time).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "..", os.environ.get("BUILD", "build"))
PARAMS = {"gpt2": 124.4e6, "gpt2-medium": 354.8e6, "gpt2-large": 774.0e6, "gpt2-xl": 1557.6e6}


def disk_bandwidth(d):
    path = os.path.join(d, "bw.bin")
    out = {}
    for what, cmd in (("write", ["dd", "if=/dev/zero", f"of={path}", "bs=4M", "count=512", "oflag=direct"]),
                      ("read", ["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"])):
        p = subprocess.run(cmd, capture_output=True, text=True)
        m = re.search(r"copied, ([0-9.]+) s", p.stderr)
        out[what] = 2147483648 / float(m.group(1)) if m else float("nan")
    os.remove(path)
    return out


CGROUP = "/sys/fs/cgroup/memory/loom-bench"  # cgroup v1's memory controller: the limit counts the page cache


def mem_cap(gb):
    """A memory cgroup of gb GB (root), or None where there is none."""
    if not gb or not os.path.isdir(os.path.dirname(CGROUP)):
        return None
    os.makedirs(CGROUP, exist_ok=True)
    with open(os.path.join(CGROUP, "memory.limit_in_bytes"), "w") as f:
        f.write(str(int(gb * 2**30)))
    return CGROUP


def run(loom, model, steps, extra, tmp, tag, cap=None):
    metrics = os.path.join(tmp, tag + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [loom, "train", "--model", model, "--bf16", "--zero-stage", "3", "--micro-batch-size", "1",
           "--global-batch-size", "1", "--seq-length", "64", "--threads", "2", "--train-iters", str(steps),
           "--eval-iters", "0", "--log-interval", "1", "--metrics", metrics, *extra]
    if cap:  # a cold page cache, and the run inside the cgroup
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        cmd = ["sh", "-c", f'echo $$ > {cap}/cgroup.procs && exec "$@"', "sh", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode == -9 or p.returncode == 137:
        return float("nan"), "killed (over the memory cap)"
    if p.returncode:
        raise SystemExit(f"{tag}: exit {p.returncode}: {p.stderr[-600:]}")
    rows = [json.loads(l) for l in open(metrics) if '"step"' in l]
    times = [r["ms_per_step"] / 1e3 for r in rows[1:]] or [float("nan")]
    rss = re.search(r"peak RSS by rank: ([0-9.]+ [KMG]B)", p.stdout + p.stderr)
    return statistics.median(times), rss.group(1) if rss else "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-large")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nvme", default=None)
    ap.add_argument("--sync-build", default=None)
    ap.add_argument("--cases", default="memory,offload,optimizer")
    ap.add_argument("--mem-cap", type=float, default=0,
                    help="GB: every run in a memory cgroup of that size (root; page cache included)")
    args = ap.parse_args()
    loom = os.path.join(BUILD, "loom")
    with tempfile.TemporaryDirectory(dir=args.nvme) as tmp:
        bw = disk_bandwidth(tmp)
        n = PARAMS[args.model]
        # bytes a step moves: optimizer file (m, v, master: fp32) read + written; bf16 parameters read by
        # the gathers (forward and backward) and the optimizer, written by it; bf16 gradients written, read
        reads = 3 * 4 * n + 3 * 2 * n + 2 * n
        writes = 3 * 4 * n + 2 * n + 2 * n
        disk_s = reads / bw["read"] + writes / bw["write"]
        print(f"{args.model}: {n / 1e6:.0f}M parameters; disk: write {bw['write'] / 1e9:.2f} GB/s, read "
              f"{bw['read'] / 1e9:.2f} GB/s; a step moves {reads / 1e9:.1f} GB in, {writes / 1e9:.1f} GB out: "
              f"{disk_s:.2f} s at those speeds", flush=True)
        off = ["--offload-param", "nvme", "--offload-optimizer", "nvme", "--nvme-path", tmp]
        cases = [("memory", loom, []), ("offload", loom, off),
                 ("optimizer", loom, ["--offload-optimizer", "nvme", "--nvme-path", tmp])]
        cases = [c for c in cases if c[0] in args.cases.split(",")]
        if "optimizer" in args.cases.split(","):
            cases.append(("optimizer-direct", loom, ["--offload-optimizer", "nvme", "--nvme-path", tmp,
                                                     "--offload-direct-io"]))
        cap = mem_cap(args.mem_cap)
        if args.mem_cap:
            print(f"memory cap: {args.mem_cap} GB" if cap else "memory cap: no cgroup v1 memory controller here")
        if args.sync_build:
            cases.append(("sync", os.path.join(args.sync_build, "loom"), ["--offload-optimizer", "nvme",
                                                                          "--nvme-path", tmp]))
        got = {c[0]: [] for c in cases}
        for r in range(args.rounds):
            for tag, exe, extra in cases:
                s, rss = run(exe, args.model, args.steps, extra, tmp, tag, cap)
                got[tag].append(s)
                print(f"round {r + 1}: {tag}: {s:.2f} s/step, peak RSS {rss}", flush=True)
        med = {k: statistics.median(v) for k, v in got.items()}
        print("median s/step: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
        if "memory" in med and "offload" in med:
            bound = max(med["memory"], disk_s)
            print(f"offload / max(memory step {med['memory']:.2f} s, disk-bound {disk_s:.2f} s) = "
                  f"{med['offload'] / bound:.2f}")
        for a in ("offload", "optimizer"):
            if "sync" in med and a in med:
                print(f"synchronous optimizer offload / {a} = {med['sync'] / med[a]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
