#!/usr/bin/env python3
"""--tensorboard-dir: TensorBoard event files that TensorBoard's own reader
(PyPI `tensorboard`, in a test-only virtual environment) loads, holding
the same figures as --metrics.

1. A tiny fp16 run with evaluations: the event file's scalars under
   Megatron's tags ("lm loss", "learning-rate", "grad-norm", "loss-scale",
   "iteration-time", "lm loss validation") and loom's own (throughput,
   memory by category) equal the --metrics rows step by step (as float32:
   TensorBoard's simple_value), every step present once.
2. Every record's framing checks: length and data CRC-32C (Castagnoli,
   masked as TFRecord masks it), recomputed here independently of loom.
3. On 2 ranks only rank 0 writes, one file.
4. Bad input: a --tensorboard-dir under a regular file is exit 2, one line
   naming the flag, and nothing is trained.
"""
import glob
import json
import os
import struct
import sys
import tempfile

import lib
from lib import LOOM, check

READER = r"""
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
out = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
print(json.dumps(out))
"""


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records_ok(path):
    """(number of records, every length and data CRC right)."""
    raw = open(path, "rb").read()
    at, n, ok = 0, 0, True
    while at < len(raw):
        head = raw[at:at + 8]
        (length,) = struct.unpack("<Q", head)
        (lcrc,) = struct.unpack("<I", raw[at + 8:at + 12])
        data = raw[at + 12:at + 12 + length]
        (dcrc,) = struct.unpack("<I", raw[at + 12 + length:at + 16 + length])
        ok = ok and lcrc == masked(head) and dcrc == masked(data) and len(data) == length
        at += 16 + length
        n += 1
    return n, ok and at == len(raw)


def main():
    py = lib.venv_python(lib.TB_VENV, lib.TENSORBOARD, "tensorboard")
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        tb, metrics = os.path.join(tmp, "tb"), os.path.join(tmp, "m.jsonl")
        common = ["train", "--data-path", os.path.join(tmp, "train.bin"), "--valid-data-path",
                  os.path.join(tmp, "corpus", "val.bin")] + lib.TINY_MODEL + [
            "--micro-batch-size", "4", "--global-batch-size", "4", "--train-iters", "12", "--eval-interval", "5",
            "--eval-iters", "2", "--threads", "1", "--log-interval", "1"]
        p = lib.run([LOOM, *common, "--fp16", "--initial-loss-scale", "1024", "--tensorboard-dir", tb, "--metrics",
                     metrics])
        check("train --fp16 --tensorboard-dir: exit 0", p.returncode == 0, p.stderr[-500:])
        files = glob.glob(os.path.join(tb, "events.out.tfevents.*"))
        check("one event file", len(files) == 1, str(files))
        if not files:
            return lib.verdict()
        n, ok = records_ok(files[0])
        check(f"every record's length and data CRC-32C check ({n} records)", ok and n > 12)
        r = lib.run([py, "-c", READER, tb])
        check("TensorBoard's EventAccumulator loads the directory", r.returncode == 0, r.stderr[-800:])
        got = json.loads(r.stdout) if r.returncode == 0 else {}
        rows = [json.loads(line) for line in open(metrics)]
        steps = [x for x in rows if "loss" in x]
        evals = [x for x in rows if "val_loss" in x]
        def f32(v):  # TensorBoard's simple_value is a float32; JSON's null is a non-finite value
            return struct.unpack("<f", struct.pack("<f", v))[0] if v is not None else "nonfinite"

        def same(seen, ref, rtol=0.0):
            """Steps equal, values equal within rtol (the metrics print some figures with 6 digits)."""
            norm = [[s, v if v == v and abs(v) != float("inf") else "nonfinite"] for s, v in seen]
            if [s for s, _ in norm] != [s for s, _ in ref]:
                return False
            return all(a == b or (isinstance(a, float) and isinstance(b, float) and abs(a - b) <= rtol * abs(b))
                       for (_, a), (_, b) in zip(norm, ref))
        want = {"lm loss": ("loss", 0), "learning-rate": ("lr", 0), "grad-norm": ("grad_norm", 0),
                "loss-scale": ("loss_scale", 0), "throughput/tokens-per-sec": ("tokens_per_s", 1e-5),
                "throughput/mfu": ("mfu", 1e-5)}
        for tag, (key, rtol) in want.items():
            seen = got.get(tag, [])
            check(f"'{tag}' equals the metrics' {key} at every one of the {len(steps)} steps",
                  len(steps) == 12 and same(seen, [[x["step"], f32(x[key])] for x in steps], rtol),
                  f"{seen[:3]} vs {[(x['step'], x[key]) for x in steps[:3]]}")
        seen = got.get("iteration-time", [])
        check("'iteration-time' is the metrics' ms_per_step in seconds",
              same(seen, [[x["step"], f32(x["ms_per_step"] / 1000)] for x in steps], 1e-5))
        for cat in ("params", "grads", "optimizer", "activations"):
            seen = got.get(f"memory/{cat}-bytes", [])
            check(f"'memory/{cat}-bytes' equals the metrics' peak {cat} bytes",
                  same(seen, [[x["step"], f32(x["mem"][cat])] for x in steps]) and seen[-1][1] > 0)
        seen = got.get("lm loss validation", [])
        # the metrics print val_loss with 9 digits: a float32 apart by at most a rounding of that
        check(f"'lm loss validation' at each evaluation ({len(evals)}) equals the metrics' val_loss",
              len(evals) >= 2 and [s for s, _ in seen] == [x["step"] for x in evals]
              and all(abs(v - x["val_loss"]) <= 1e-7 * abs(x["val_loss"]) for (_, v), x in zip(seen, evals)),
              f"{seen} vs {evals}")

        tb2 = os.path.join(tmp, "tb2")
        p = lib.run_ranks(2, [LOOM, *common, "--micro-batch-size", "2", "--tensorboard-dir", tb2], tag="tb2")
        files = glob.glob(os.path.join(tb2, "*"))
        check("2 ranks: rank 0 alone writes, one event file", p.returncode == 0 and len(files) == 1, str(files))

        blocker = os.path.join(tmp, "file")
        open(blocker, "w").close()
        p = lib.run([LOOM, *common, "--tensorboard-dir", os.path.join(blocker, "tb")])
        lines = lib.error_lines(p.stderr)
        check("a --tensorboard-dir under a file: exit 2, one line naming the flag, nothing trained",
              p.returncode == 2 and len(lines) == 1 and "--tensorboard-dir" in lines[0] and "step" not in p.stdout,
              p.stderr[-300:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
