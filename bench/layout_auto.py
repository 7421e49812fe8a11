"""--layout auto against hand-picked layouts, side by side, on 2 ranks.

For each memory budget, `loom train --layout auto --mem-per-rank GB` picks
a layout; its choice, predicted memory and step time, and the measured ones
(the run's own closing line) are recorded. The hand-picked layouts below
run in the same rounds (alternating with the auto runs, every layout once a
round); a hand-picked layout counts for a budget when its measured memory
(loom's accounting of the last step, every category but the bookkeeping,
the largest rank: what the planner counts) is within it, and the best is
the fastest of those. Step times are medians of steps 2..N pooled over the
rounds. Prints a table per model: budget, auto's choice, predicted and
measured step and memory, the best hand-picked layout and its step, and
auto's step over the best's (target: at most 1.1).

    make && /usr/bin/python3 bench/layout_auto.py [--model gpt2|gpt2-xl] [--rounds R] [--steps N]
        [--budgets GB,GB,...] [--nvme DIR]

GPT-2 124M: bf16, T=256, global batch 16. GPT-2 XL: bf16, T=64, global
batch 4, with --nvme-path (the optimizer state offloaded where the budget
asks for it). One thread a rank (two cores).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

from common import ENV, LOOM

MODELS = {
    "gpt2": {"base": ["--model", "gpt2", "--bf16", "--seq-length", "256", "--global-batch-size", "16"],
             "budgets": [11.0, 3.0, 1.6],
             "hand": [("DDP, micro 8", "--micro-batch-size 8"),
                      ("DDP, micro 4", "--micro-batch-size 4"),
                      ("ZeRO-1, micro 8", "--zero-stage 1 --micro-batch-size 8"),
                      ("ZeRO-2, micro 8", "--zero-stage 2 --micro-batch-size 8"),
                      ("ZeRO-3, micro 8", "--zero-stage 3 --micro-batch-size 8"),
                      ("ZeRO-3, micro 2", "--zero-stage 3 --micro-batch-size 2"),
                      ("ZeRO-3, micro 1, selective", "--zero-stage 3 --micro-batch-size 1 "
                                                     "--recompute-granularity selective"),
                      ("TP 2, micro 8", "--tensor-model-parallel-size 2 --micro-batch-size 8"),
                      ("TP 2 + SP, micro 8", "--tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 8"),
                      ("TP 2 + SP, micro 4", "--tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 4"),
                      ("TP 2 + SP, micro 2", "--tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 2")]},
    "gpt2-xl": {"base": ["--model", "gpt2-xl", "--bf16", "--seq-length", "64", "--global-batch-size", "4"],
                "budgets": [11.0, 6.0],
                "hand": [("ZeRO-3, optimizer on NVMe, micro 2",
                          "--zero-stage 3 --micro-batch-size 2 --offload-optimizer nvme"),
                         ("ZeRO-3, optimizer on NVMe, micro 1",
                          "--zero-stage 3 --micro-batch-size 1 --offload-optimizer nvme"),
                         ("ZeRO-2, optimizer on NVMe, micro 2",
                          "--zero-stage 2 --micro-batch-size 2 --offload-optimizer nvme")]},
}


def train(args, steps, tmp, tag):
    metrics = os.path.join(tmp, tag + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = ["mpirun", "--oversubscribe", "-np", "2", LOOM, "train", *args, "--train-iters", str(steps),
           "--log-interval", "1", "--eval-iters", "0", "--threads", "1", "--metrics", metrics]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    last = rows[-1]
    ranks = last.get("mem_by_rank") or [last["mem"]]
    mem = max(sum(v for k, v in r.items() if k not in ("other", "total")) for r in ranks)
    return {"ms": [r["ms_per_step"] for r in rows[1:]], "mem": mem, "out": p.stdout}, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--budgets", default="")
    ap.add_argument("--nvme", default="")
    a = ap.parse_args()
    spec = MODELS[a.model]
    budgets = [float(b) for b in a.budgets.split(",")] if a.budgets else spec["budgets"]
    with tempfile.TemporaryDirectory() as tmp:
        nvme = a.nvme or os.path.join(tmp, "nvme")
        os.makedirs(nvme, exist_ok=True)
        base = spec["base"] + ["--nvme-path", nvme]
        auto = {b: {"ms": [], "choice": None} for b in budgets}
        hand = {name: {"ms": [], "mem": None, "why": None} for name, _ in spec["hand"]}
        for r in range(a.rounds):
            for b in budgets:
                got, why = train(base + ["--layout", "auto", "--mem-per-rank", str(b)], a.steps, tmp, "auto")
                if got is None:
                    auto[b]["choice"] = why
                    print(f"round {r + 1} auto {b} GB: {why}", flush=True)
                    continue
                auto[b]["ms"] += got["ms"]
                c = re.search(r"^layout auto: (.*?): predicted ([0-9.]+ \w+) a rank .*? and ([0-9.]+) s a step",
                              got["out"], re.M)
                auto[b]["choice"] = c.group(1) if c else "?"
                auto[b]["pred_mem"], auto[b]["pred_s"] = (c.group(2), float(c.group(3))) if c else ("?", 0)
                auto[b]["mem"] = got["mem"]
                print(f"round {r + 1} auto {b} GB: {auto[b]['choice']}: median "
                      f"{statistics.median(got['ms']):.0f} ms", flush=True)
            for name, flags in spec["hand"]:
                got, why = train(base + flags.split(), a.steps, tmp, "hand")
                if got is None:
                    hand[name]["why"] = why
                    print(f"round {r + 1} {name}: {why}", flush=True)
                    continue
                hand[name]["ms"] += got["ms"]
                hand[name]["mem"] = got["mem"]
                print(f"round {r + 1} {name}: median {statistics.median(got['ms']):.0f} ms, "
                      f"{got['mem'] / 1e9:.2f} GB", flush=True)
        print(f"\n{a.model} on 2 ranks, {a.rounds} rounds, {a.steps} steps (the first dropped):\n")
        print("| budget | auto's layout | predicted | measured | best hand-picked within the budget | its step "
              "| auto / best |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for b in budgets:
            e = auto[b]
            fits = [(statistics.median(h["ms"]), n) for n, h in hand.items()
                    if h["ms"] and h["mem"] is not None and h["mem"] <= b * 1e9]
            best = min(fits) if fits else None
            if not e["ms"]:
                print(f"| {b} GB | {e['choice']} | - | - | {best[1] if best else '-'} | "
                      f"{best[0] / 1e3:.3f} s |  - |" if best else f"| {b} GB | {e['choice']} | - | - | - | - | - |")
                continue
            med = statistics.median(e["ms"]) / 1e3
            print(f"| {b} GB | {e['choice']} | {e['pred_s']:.3f} s, {e['pred_mem']} | {med:.3f} s, "
                  f"{e['mem'] / 1e9:.2f} GB | {best[1] if best else '-'} | "
                  f"{best[0] / 1e3:.3f} s | {med / (best[0] / 1e3):.2f} |" if best else
                  f"| {b} GB | {e['choice']} | {e['pred_s']:.3f} s, {e['pred_mem']} | {med:.3f} s | - | - | - |")
        print("\nhand-picked: " + "; ".join(
            f"{n}: {statistics.median(h['ms']) / 1e3:.3f} s, {h['mem'] / 1e9:.2f} GB" if h["ms"] else f"{n}: {h['why']}"
            for n, h in hand.items()))


if __name__ == "__main__":
    main()
