"""One switch (--plugin NAME, "plugin" in the JSON; src/config/plugin.c) and
--layout auto (src/app/layout_auto.c):

1. Every plugin trains gpt2-tiny on 1, 2 and 4 ranks with the single
   process's per-step losses (20 steps) and final weights within 1e-5
   relative: torch_ddp, torch_fsdp, low_level_zero (stages 1 and 2), gemini
   (ZeRO-3 with --offload auto), hybrid_parallel (--tp/--pp/--zero-stage),
   deepspeed (a DeepSpeed JSON), megatron (Megatron's flags). The printed
   settings show what a plugin set with the origin "plugin".
2. A plugin that contradicts a setting given by flag or in the JSON is
   refused with one line naming both (exit 2), and so are a plugin's
   missing inputs (gemini's --nvme-path, deepspeed's JSON), --plugin-stage
   beside another plugin, and --layout auto beside a plugin.
3. --layout auto on 1 and 2 ranks picks a layout that runs, prints it (the
   settings it set with the origin "layout auto"), and its predicted memory
   a rank is within 5% of the trainer's accounting of the categories the
   planner counts (every one but the bookkeeping, "other"); --dry-run shows
   the choice and trains nothing; with --layout-invariant 1 it takes
   tensor-parallel size 1; a budget nothing fits is refused up front,
   naming the budget; without --global-batch-size it is refused.
"""
import json
import os
import re
import sys
import tempfile

import lib
from lib import check

BASE = ["--global-batch-size", "8", "--micro-batch-size", "2"]


def plugins(tmp, n):
    """(name, flags) of every plugin for n ranks."""
    ds = os.path.join(tmp, "ds.json")
    with open(ds, "w") as f:
        json.dump({"zero_optimization": {"stage": 2}}, f)
    nvme = os.path.join(tmp, "nvme")
    os.makedirs(nvme, exist_ok=True)
    hybrid = {1: [], 2: ["--tp", "2"], 4: ["--tp", "2", "--pp", "2", "--zero-stage", "1"]}[n]
    megatron = {1: [], 2: ["--tensor-model-parallel-size", "2"],
                4: ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"]}[n]
    return [("torch_ddp", []), ("torch_fsdp", []), ("low_level_zero", ["--plugin-stage", "1"]),
            ("low_level_zero", ["--plugin-stage", "2"]), ("gemini", ["--nvme-path", nvme]),
            ("hybrid_parallel", hybrid), ("deepspeed", ["--deepspeed-config", ds]), ("megatron", megatron)]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        ref = lib.tiny_run(tmp, "single", 1, BASE)
        # 1. every plugin at 1, 2 and 4 ranks
        for n in (1, 2, 4):
            for name, extra in plugins(tmp, n):
                tag = f"{name}{extra[1] if name == 'low_level_zero' else ''}-{n}"
                got = lib.tiny_run(tmp, tag, n, BASE + ["--plugin", name] + extra)
                lib.compare_runs(f"--plugin {name} {' '.join(extra[:2]) if name != 'gemini' else ''} on {n} ranks"
                                 .replace("  ", " "), ref, got)
        p = lib.loom("train", "--plugin", "torch_fsdp", "--dry-run")
        check("--dry-run shows what --plugin torch_fsdp set, with the origin 'plugin'",
              p.returncode == 0 and re.search(r"fsdp-sharding-strategy\s+FULL_SHARD\s+\(plugin\)", p.stdout) and
              re.search(r"tensor-model-parallel-size\s+1\s+\(plugin\)", p.stdout), p.stdout[-600:])

        # 2. contradictions and missing inputs
        ds1 = os.path.join(tmp, "ds1.json")
        with open(ds1, "w") as f:
            json.dump({"zero_optimization": {"stage": 1}}, f)
        for why, flags, needles in (
                ("torch_ddp beside --zero-stage 2", ["--plugin", "torch_ddp", "--zero-stage", "2"],
                 ["--plugin torch_ddp", "--zero-stage 0", "--zero-stage 2"]),
                ("low_level_zero beside --tensor-model-parallel-size 2",
                 ["--plugin", "low_level_zero", "--tensor-model-parallel-size", "2"],
                 ["--plugin low_level_zero", "--tensor-model-parallel-size"]),
                ("gemini beside a JSON ZeRO stage 1", ["--plugin", "gemini", "--nvme-path", tmp,
                                                        "--deepspeed-config", ds1],
                 ["--plugin gemini", "--zero-stage 1", "JSON"]),
                ("gemini without --nvme-path when the state does not fit in memory",
                 ["--plugin", "gemini", "--mem-per-rank", "0.01"], ["--offload auto", "--nvme-path"]),
                ("deepspeed without a JSON", ["--plugin", "deepspeed"], ["--plugin deepspeed", "--deepspeed-config"]),
                ("--plugin-stage beside torch_ddp", ["--plugin", "torch_ddp", "--plugin-stage", "2"],
                 ["--plugin-stage", "torch_ddp"]),
                ("an unknown plugin", ["--plugin", "colossal"], ["colossal"]),
                ("--layout auto beside --plugin torch_ddp", ["--plugin", "torch_ddp", "--layout", "auto",
                                                             "--global-batch-size", "8"],
                 ["--layout auto", "torch_ddp"])):
            p = lib.loom("train", "--train-iters", "1", *flags)
            errs = lib.error_lines(p.stderr)
            check(f"{why}: exit 2, one line naming it", p.returncode == 2 and len(errs) == 1 and
                  all(x in errs[0] for x in needles), p.stderr[-300:])

        # 3. --layout auto
        for n in (1, 2):
            m = os.path.join(tmp, f"auto{n}.jsonl")
            p = lib.run_ranks(n, [lib.LOOM, "train", "--model", "gpt2-tiny", "--layout", "auto", "--global-batch-size",
                                  "16", "--train-iters", "4", "--log-interval", "1", "--eval-iters", "0",
                                  "--threads", "1", "--metrics", m], tag=f"layout auto on {n}")
            chose = re.search(r"^layout auto: (.*): predicted ([0-9.]+) (MB|GB|KB)", p.stdout, re.M)
            end = re.search(r"layout auto: predicted ([0-9.]+ \w+) a rank and ([0-9.]+) s a step; measured "
                            r"([0-9.]+ \w+) .*?([+-][0-9.]+)%\) and ([0-9.]+) s a step", p.stdout)
            check(f"--layout auto on {n} rank(s): runs the layout it prints ({chose.group(1) if chose else '?'})",
                  p.returncode == 0 and chose is not None and len(lib.metrics_rows(m)) == 4, p.stdout[-400:])
            err = float(end.group(4)) if end else 100.0
            check(f"--layout auto on {n} rank(s): predicted memory a rank {end.group(1) if end else '?'} against "
                  f"measured {end.group(3) if end else '?'} ({err:+.1f}%, within 5%)", abs(err) <= 5.0, p.stdout[-400:])
            check(f"--layout auto on {n} rank(s): the settings it set show the origin 'layout auto'",
                  "(layout auto)" in p.stdout)
        p = lib.run_ranks(2, [lib.LOOM, "train", "--model", "gpt2-tiny", "--layout", "auto", "--global-batch-size",
                              "16", "--dry-run"], tag="layout auto --dry-run")
        check("--layout auto --dry-run: shows the choice and trains nothing",
              p.returncode == 0 and "layout auto: " in p.stdout and "step 1" not in p.stdout, p.stdout[-300:])
        # with --layout-invariant 1 only tensor-parallel size 1 is a candidate: fewer layouts compared
        counts = {}
        for inv in ([], ["--layout-invariant", "1"]):
            q = lib.run_ranks(2, [lib.LOOM, "train", "--model", "gpt2-tiny", "--layout", "auto", "--global-batch-size",
                                  "16", "--dry-run"] + inv, expect=None, tag="layout auto, invariant")
            m = re.search(r"layout auto: tp (\d+) x.*of (\d+)[:)]", q.stdout)
            counts[bool(inv)] = (q.returncode, m and int(m.group(1)), m and int(m.group(2)))
        check(f"--layout auto --layout-invariant 1 on 2 ranks: tensor-parallel size 1, fewer layouts compared "
              f"({counts})", counts[True][:2] == (0, 1) and counts[False][0] == 0 and
              counts[True][2] is not None and counts[False][2] is not None and counts[True][2] < counts[False][2])
        p = lib.run_ranks(2, [lib.LOOM, "train", "--model", "gpt2-tiny", "--layout", "auto", "--global-batch-size",
                              "16", "--mem-per-rank", "0.001"], expect=2, tag="layout auto, 1 MB")
        errs = lib.error_lines(p.stderr)
        check("--layout auto with 1 MB a rank: exit 2, one line naming the budget and the least need",
              len(errs) == 1 and "1.0 MB" in errs[0] and "needs" in errs[0], p.stderr[-300:])
        p = lib.loom("train", "--model", "gpt2-tiny", "--layout", "auto")
        errs = lib.error_lines(p.stderr)
        check("--layout auto without --global-batch-size: exit 2, one line naming it",
              p.returncode == 2 and len(errs) == 1 and "--global-batch-size" in errs[0], p.stderr[-300:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
