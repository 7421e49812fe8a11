#!/usr/bin/env python3
"""--trace FILE: a Chrome trace-event JSON (Perfetto, chrome://tracing) of
every rank's steps.

1. One process, --trace-steps 2:4: the file is trace-event JSON (an object
   with traceEvents; every event has a name, a phase among X, M, b and e,
   integer pid and tid, a timestamp, X events a duration >= 0); it holds
   steps 2, 3 and 4 only; each step's slice lasts the metrics' ms_per_step
   (within 5%); the compute row's slices do not overlap, lie inside their
   step and cover most of it (>= 80%: the rest is the schedule's own code
   between blocks); every block's forward and backward, the data and the
   optimizer step appear in every step.
2. DDP on 2 ranks (default window: the run's first ten steps, here all 3):
   one process per rank, named, with its compute and communication rows;
   the communication row's transfers are begin/end pairs with their bytes
   and group, gradient all-reduces over the data-parallel group among them.
3. A 2-stage pipeline (1F1B): the waits on the neighbouring stage (the
   bubble) are on the communication row, with bytes, and the compute row
   is empty while they last.
4. Bad input: --trace-steps 5:2, --trace-steps without --trace, and a
   --trace path whose folder does not exist are each exit 2, one line
   naming the flag, before any step.
"""
import json
import os
import sys
import tempfile

import lib
from lib import LOOM, check

PHASES = {"X", "M", "b", "e"}
# Slices that meet (one ends where the next starts, in the same clock read)
# can look apart or overlapping in the file: ts and dur are printed with
# %.3f (microseconds, a 1e-3 grid), so an end ts + dur and a start, or two
# such ends, each carry up to two roundings of 5e-4 and land at most two
# grid steps (2e-3) apart, plus the float error of adding the parsed values.
# SLACK sits halfway between two steps and three; a real overlap or gap is
# an activity's length, a microsecond or more. (1e-3, one step exactly, was
# what two meeting slices can measure, and Python's sum could tip it over.)
SLACK = 2.5e-3


def valid(doc):
    """Why doc is not trace-event JSON as loom writes it, or None."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return "no traceEvents list"
    for e in doc["traceEvents"]:
        if not isinstance(e.get("name"), str) or e.get("ph") not in PHASES:
            return f"bad name or phase: {e}"
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            return f"pid/tid not integers: {e}"
        if e["ph"] != "M" and not (isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0):
            return f"bad timestamp: {e}"
        if e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            return f"bad duration: {e}"
        if e["ph"] in ("b", "e") and "id" not in e:
            return f"async event without id: {e}"
    return None


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": str(e)}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        base = ["train", "--data-path", os.path.join(tmp, "train.bin")] + lib.TINY_MODEL + [
            "--global-batch-size", "8", "--threads", "1", "--log-interval", "1", "--eval-iters", "0"]

        # 1. one process
        trace, metrics = os.path.join(tmp, "one.json"), os.path.join(tmp, "one.jsonl")
        p = lib.run([LOOM, *base, "--micro-batch-size", "4", "--train-iters", "5", "--trace", trace,
                     "--trace-steps", "2:4", "--metrics", metrics])
        check("one process --trace --trace-steps 2:4: exit 0", p.returncode == 0, p.stderr[-400:])
        doc = load(trace)
        why = valid(doc)
        check("the file is trace-event JSON", why is None, str(why))
        ev = doc.get("traceEvents", []) if why is None else []
        steps = [e for e in ev if e.get("cat") == "step"]
        check("steps 2, 3 and 4 only", [e["args"]["step"] for e in steps] == [2, 3, 4],
              str([e["name"] for e in steps]))
        rows = {r["step"]: r for r in lib.metrics_rows(metrics)}
        check("each step's slice lasts the metrics' ms_per_step (within 5%)",
              steps and all(abs(e["dur"] / 1e3 - rows[e["args"]["step"]]["ms_per_step"])
                            <= 0.05 * rows[e["args"]["step"]]["ms_per_step"] for e in steps),
              str([(e["dur"] / 1e3, rows.get(e["args"]["step"], {}).get("ms_per_step")) for e in steps]))
        slices = sorted((e for e in ev if e["ph"] == "X" and e["tid"] == 0 and e.get("cat") != "step"),
                        key=lambda e: e["ts"])
        overlap = [(a["name"], b["name"]) for a, b in zip(slices, slices[1:]) if a["ts"] + a["dur"] > b["ts"] + SLACK]
        check(f"the compute row's {len(slices)} slices do not overlap", not overlap, str(overlap[:3]))
        want = {"data", "optimizer step", "forward embedding", "forward head", "backward head", "backward embedding"}
        want |= {f"{d} layer {l}" for d in ("forward", "backward") for l in range(2)}
        for s in steps:
            inside = [e for e in slices if e["ts"] >= s["ts"] - SLACK and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + SLACK]
            cover = sum(e["dur"] for e in inside) / s["dur"]
            missing = want - {e["name"] for e in inside}
            check(f"{s['name']}: its slices cover {100 * cover:.0f}% of it (>= 80%), every block's forward and "
                  f"backward, data and the optimizer step among them", cover >= 0.8 and not missing, str(missing))
        outside = [e for e in slices if not any(s["ts"] - SLACK <= e["ts"] <= s["ts"] + s["dur"] + SLACK for s in steps)]
        check("no slice outside the traced steps", not outside, str(outside[:2]))

        # 2. DDP on 2 ranks
        trace = os.path.join(tmp, "ddp.json")
        p = lib.run_ranks(2, [LOOM, *base, "--micro-batch-size", "2", "--train-iters", "3", "--trace", trace],
                          tag="ddp")
        doc = load(trace)
        why = valid(doc)
        check("DDP 2 ranks: exit 0, trace-event JSON", p.returncode == 0 and why is None, str(why))
        ev = doc.get("traceEvents", []) if why is None else []
        names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
        threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
        check("one process per rank, named, each with a compute and a communication row",
              {pid for pid, _ in names} == {0, 1} and all(n.startswith(f"rank {pid} ") for pid, n in names)
              and threads == {(r, 0, "compute") for r in (0, 1)} | {(r, 1, "communication") for r in (0, 1)},
              f"{names} {threads}")
        check("default window: the run's 3 steps on each rank",
              sorted(e["args"]["step"] for e in ev if e.get("cat") == "step") == [1, 1, 2, 2, 3, 3])
        begins = {(e["pid"], e["id"]): e for e in ev if e["ph"] == "b"}
        ends = {(e["pid"], e["id"]): e for e in ev if e["ph"] == "e"}
        paired = begins.keys() == ends.keys() and all(ends[k]["ts"] >= begins[k]["ts"] for k in begins)
        reduces = [e for e in begins.values() if e["name"] == "all-reduce dp" and e["args"]["bytes"] > 0]
        check(f"communication: {len(begins)} transfers as begin/end pairs with bytes and group, the gradients' "
              f"all-reduce over dp among them on both ranks",
              paired and all(e["tid"] == 1 and "group" in e["args"] for e in begins.values())
              and {e["pid"] for e in reduces} == {0, 1}, str(list(begins.values())[:2]))

        # 3. a pipeline's bubble
        trace = os.path.join(tmp, "pp.json")
        p = lib.run_ranks(2, [LOOM, *base, "--micro-batch-size", "2", "--train-iters", "2",
                              "--pipeline-model-parallel-size", "2", "--trace", trace], tag="pp")
        doc = load(trace)
        why = valid(doc)
        ev = doc.get("traceEvents", []) if why is None else []
        waits = [e for e in ev if e.get("cat") == "wait" and e["name"].endswith(" pp")]
        check(f"P 2: exit 0, trace-event JSON, waits on the neighbouring stage ({len(waits)}) on both ranks' "
              f"communication rows, with bytes",
              p.returncode == 0 and why is None and {e["pid"] for e in waits} == {0, 1}
              and all(e["tid"] == 1 and e["args"]["bytes"] > 0 for e in waits), str(why))
        busy = [e for e in ev if e["ph"] == "X" and e["tid"] == 0 and e.get("cat") == "compute"]
        clash = [(w["name"], c["name"]) for w in waits for c in busy
                 if c["pid"] == w["pid"] and c["ts"] < w["ts"] + w["dur"] - SLACK and w["ts"] < c["ts"] + c["dur"] - SLACK]
        check("the compute row is empty while a rank waits", not clash, str(clash[:3]))

        # 4. bad input
        for flags, name in ((["--trace", os.path.join(tmp, "t.json"), "--trace-steps", "5:2"], "--trace-steps"),
                            (["--trace-steps", "2:3"], "--trace-steps"),
                            (["--trace", os.path.join(tmp, "no", "such", "t.json")], "--trace")):
            p = lib.run([LOOM, *base, "--micro-batch-size", "4", "--train-iters", "2", *flags])
            lines = lib.error_lines(p.stderr)
            check(f"{' '.join(flags[-2:])}: exit 2, one line naming {name}, no step",
                  p.returncode == 2 and len(lines) == 1 and name in lines[0] and "step 1" not in p.stdout,
                  p.stderr[-300:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
