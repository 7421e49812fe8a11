"""Optimizer offload to files (--offload-optimizer nvme): the run equals the
in-memory run bit for bit (every logged number and every saved weight), the
resident optimizer bytes stay within --offload-buffer-size, nothing is left
in --nvme-path, and a bad path is a one-line error. Also under ZeRO-1 at 2
ranks, where each rank streams its own shard, and with bf16 (the master
weights in the file too) at 1 rank and under ZeRO-3 at 2. A file system too
small for the file is refused up front (exit 2, the bytes needed). ZeRO-3
with --offload-param nvme (ZeRO-Infinity: the parameter and gradient shards
in files too) at 1 and 2 ranks, fp32 and bf16, with and without gradient
accumulation; the streaming through the page cache (the default) and with
O_DIRECT (--offload-direct-io). --offload auto meets a budget the in-memory run exceeds,
measured, with the in-memory run's losses."""
import os
import re
import subprocess
import sys
import tempfile

import lib
from lib import check


def auto_budget(tmp, nvme):
    """--offload auto on gpt2-tiny made wide (12.6M parameters: 200 MB of
    state, a step's activations a little more): a budget the in-memory run
    exceeds by its own count is met by offloading what the count says, the
    measured peak RSS stays within it, and the run is the in-memory run.
    The tightest budget also saves a checkpoint and resumes from it: the
    offloaded state goes to the checkpoint and back a staging buffer at a
    time (gathered whole it would take 150 MB more, past the budget), and
    the resumed steps are the in-memory run's."""
    model = ["--model", "gpt2-tiny", "--hidden-size", "512", "--num-attention-heads", "8", "--zero-stage", "3",
             "--train-iters", "5", "--threads", "1", "--eval-iters", "0", "--log-interval", "1"]

    def run(tag, extra):
        metrics = os.path.join(tmp, tag + ".jsonl")
        p = lib.loom("train", *model, "--metrics", metrics, *extra, env=lib.ENV)
        rss = re.search(r"peak RSS by rank: ([0-9.]+) MB", p.stdout)
        return p, [r["loss"] for r in lib.metrics_rows(metrics)], float(rss.group(1)) if rss else None

    _, want, mem_rss = run("auto-memory", [])
    save = os.path.join(tmp, "auto-save")
    for budget, level in ((0.47, "optimizer state on NVMe"),
                          (0.40, "optimizer state and the ZeRO-3 parameter and gradient shards on NVMe")):
        stop = ["--exit-interval", "3", "--save", save] if budget == 0.40 else []
        p, got, rss = run(f"auto-{budget}", ["--offload", "auto", "--mem-per-rank", str(budget), "--nvme-path", nvme]
                          + stop)
        chosen = [l for l in p.stdout.splitlines() if l.startswith("offload auto: budget")]
        check(f"--offload auto --mem-per-rank {budget}: chooses '{level}' (in memory it peaks at {mem_rss} MB)",
              p.returncode == 0 and bool(chosen) and f"chosen: {level} (" in chosen[0],
              (chosen[0] if chosen else p.stderr[-300:]))
        check(f"--offload auto --mem-per-rank {budget}: measured peak RSS {rss} MB within {budget * 1000:.0f} MB"
              f"{' with a checkpoint saved' if stop else ''}, said after the first step",
              rss is not None and rss <= budget * 1000 and "within the budget" in p.stdout, p.stdout[-300:])
        check(f"--offload auto --mem-per-rank {budget}: every step's loss equals the in-memory run's",
              got == want[:len(got)] and len(got) == (3 if stop else 5), f"{got} vs {want}")
        check(f"--offload auto --mem-per-rank {budget}: nothing left in --nvme-path", os.listdir(nvme) == [])
        if stop:
            p, got, rss = run("auto-resumed", ["--offload", "auto", "--mem-per-rank", str(budget), "--nvme-path",
                                               nvme, "--load", save])
            check(f"--offload auto --mem-per-rank {budget}, resumed from the offloaded run's checkpoint: steps 4 "
                  f"and 5 are the in-memory run's, peak RSS {rss} MB within the budget",
                  p.returncode == 0 and got == want[3:] and rss is not None and rss <= budget * 1000,
                  f"{got} vs {want[3:]}; {p.stderr[-300:]}")
    for why, extra, needle in (("without --nvme-path, the state not fitting in memory", ["--mem-per-rank", "0.01"],
                                "--nvme-path"),
                               ("beside --offload-optimizer nvme",
                                ["--nvme-path", nvme, "--offload-optimizer", "nvme"], "--offload-optimizer")):
        p, _, _ = run("auto-bad", ["--offload", "auto", *extra])
        errs = lib.error_lines(p.stderr)
        check(f"--offload auto {why}: exit 2, one line naming it", p.returncode == 2 and len(errs) == 1 and
              needle in errs[0], p.stderr[-300:])
    p, _, _ = run("auto-small", ["--offload", "auto", "--mem-per-rank", "0.1", "--nvme-path", nvme])
    errs = lib.error_lines(p.stderr)
    check("--offload auto with a budget nothing fits: exit 2 up front, one line naming the budget and the need",
          p.returncode == 2 and len(errs) == 1 and "100.0 MB" in errs[0] and "needs" in errs[0], p.stderr[-300:])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        nvme = os.path.join(tmp, "nvme")
        os.mkdir(nvme)
        buffer_mb = 0.05  # 50 KB: 3 sets of one 4 KB block per array (direct I/O's unit), tens of chunks a step
        param = ["--zero-stage", "3", "--offload-param", "nvme"]  # ZeRO-Infinity: the shards in files too
        for n, extra in ((1, []), (2, ["--zero-stage", "1"]), (1, ["--bf16"]), (2, ["--zero-stage", "3", "--bf16"]),
                         (1, param), (2, param), (1, param + ["--bf16"]), (2, param + ["--bf16"]),
                         (2, param + ["--bf16", "--micro-batch-size", "1"]),
                         (1, ["--offload-direct-io"]), (2, param + ["--bf16", "--offload-direct-io"])):
            base = ["--global-batch-size", "8", "--micro-batch-size", "2"] + extra
            tag = f"np{n}{'-' + '-'.join(x.strip('-') for x in extra) if extra else ''}"
            a = lib.tiny_run(tmp, f"mem-{tag}", n,
                             [x for x in base if x not in ("--offload-param", "nvme", "--offload-direct-io")])
            b = lib.tiny_run(tmp, f"nvme-{tag}", n, base + ["--offload-optimizer", "nvme", "--nvme-path", nvme,
                                                            "--offload-buffer-size", str(buffer_mb)])
            rows_a = lib.metrics_rows(os.path.join(tmp, f"mem-{tag}.jsonl"))
            rows_b = lib.metrics_rows(os.path.join(tmp, f"nvme-{tag}.jsonl"))
            strip = lambda r: {k: v for k, v in r.items() if k in ("step", "loss", "lr", "grad_norm")}
            check(f"{tag}: every step's loss, lr and grad norm identical to the in-memory run",
                  [strip(r) for r in rows_a] == [strip(r) for r in rows_b] and len(rows_a) == lib.STEPS)
            same = all((a[1][k] == b[1][k]).all() for k in a[1])
            check(f"{tag}: final weights identical bit for bit", same)
            mem = rows_b[-1]
            per_rank = [r["optimizer"] for r in mem.get("mem_by_rank", [mem["mem"]])]
            check(f"{tag}: resident optimizer bytes {per_rank} <= buffer {buffer_mb * 1e6:.0f}",
                  all(x <= buffer_mb * 1e6 for x in per_rank))
            check(f"{tag}: nothing left in --nvme-path", os.listdir(nvme) == [], str(os.listdir(nvme)))
        p = lib.loom("train", "--data-path", os.path.join(tmp, "train.bin"), "--train-iters", "1",
                     "--offload-optimizer", "nvme", "--nvme-path", os.path.join(tmp, "nope"), env=lib.ENV)
        check("a missing --nvme-path is exit 2 naming it",
              p.returncode == 2 and "--nvme-path" in p.stderr and "nope" in p.stderr, p.stderr)
        p = lib.loom("train", "--train-iters", "1", "--offload-optimizer", "nvme", env=lib.ENV)
        check("nvme without --nvme-path is exit 2", p.returncode == 2 and "--nvme-path" in p.stderr, p.stderr)
        for why, args, needle in (
                ("--offload-param nvme without ZeRO-3", ["--zero-stage", "2", "--offload-param", "nvme",
                                                         "--offload-optimizer", "nvme", "--nvme-path", nvme],
                 "--zero-stage 3"),
                ("--offload-param nvme without --offload-optimizer nvme",
                 ["--zero-stage", "3", "--offload-param", "nvme", "--nvme-path", nvme], "--offload-optimizer nvme")):
            p = lib.loom("train", "--train-iters", "1", *args, env=lib.ENV)
            errs = lib.error_lines(p.stderr)
            check(f"{why}: exit 2, one line naming it", p.returncode == 2 and len(errs) == 1 and needle in errs[0],
                  p.stderr[-300:])
        auto_budget(tmp, nvme)
        # a file system too small for the file: refused up front, naming the bytes needed
        small = os.path.join(tmp, "small")
        os.mkdir(small)
        if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", small],
                                                capture_output=True).returncode == 0:
            try:
                p = lib.loom("train", "--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL,
                             "--train-iters", "1", "--offload-optimizer", "nvme", "--nvme-path", small, env=lib.ENV)
                errs = lib.error_lines(p.stderr)
                check("a file system without room for the offload file: exit 2 up front, one line naming the path, "
                      "the bytes needed and free", p.returncode == 2 and len(errs) == 1 and small in errs[0] and
                      "needs" in errs[0] and "free" in errs[0], p.stderr[-300:])
                check("... and nothing left there", os.listdir(small) == [], str(os.listdir(small)))
            finally:
                subprocess.run(["umount", small])
        else:
            print("note: not root (or no tmpfs): the full-disk case is not run")
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
