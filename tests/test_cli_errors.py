#!/usr/bin/env python3
"""`loom train` on bad input: each case must exit with status 2 and print a
single line on stderr, `loom: error: ...`, naming the culprit (the flag, file,
tensor or value). Plus one positive smoke run. Tiny models throughout, so the
whole file takes seconds. Exits 1 on any failure.
"""
import functools
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

import lib
from pyref import gpt2, shard, st

L, C, NH, T, V, B = 1, 16, 2, 8, 256, 2
TINY = ["--num-layers", L, "--hidden-size", C, "--num-attention-heads", NH, "--seq-length", T,
        "--vocab-size", V, "--micro-batch-size", B, "--train-iters", 1, "--eval-iters", 0, "--threads", 1]
loom = functools.partial(lib.loom, timeout=60)


class Files:
    """Inputs for the cases, written once into a temporary directory."""

    def __init__(self, tmp):
        self.tmp = tmp
        rng = np.random.default_rng(5)
        self.good = self.path("good.bin")
        shard.write(self.good, rng.integers(0, V, size=4096))
        self.missing = self.path("no-such-shard.bin")
        self.directory = self.path("a-directory.bin")
        os.mkdir(self.directory)
        self.bad_magic = self.path("bad-magic.bin")
        shard.write(self.bad_magic, rng.integers(0, V, size=512), magic=20240521)
        self.truncated = self.path("truncated.bin")
        shard.write(self.truncated, rng.integers(0, V, size=512), count=4096)  # header promises more
        self.big_token = self.path("big-token.bin")
        toks = rng.integers(0, V, size=512)
        toks[100] = 300
        shard.write(self.big_token, toks)
        weights = gpt2.to_numpy(gpt2.init_weights(gpt2.GPT2(gpt2.Config(L, C, NH, V, 64)), 1))
        self.weights = self.path("w.safetensors")
        st.save(self.weights, weights, {"format": "pt"})
        self.no_tensor = self.path("missing-tensor.safetensors")
        st.save(self.no_tensor, {k: v for k, v in weights.items() if k != "h.0.mlp.c_fc.bias"})
        self.bad_shape = self.path("wrong-shape.safetensors")
        w = dict(weights)
        w["h.0.attn.c_proj.weight"] = np.zeros((C, C + 1), np.float32)
        st.save(self.bad_shape, w)

    def path(self, name):
        return os.path.join(self.tmp, name)


def expect_error(name, args, needles, alternatives=()):
    """Exit 2, exactly one non-empty stderr line starting 'loom: error: ' and
    containing every string in needles and, if given, one of alternatives."""
    try:
        p = loom(*args)
    except subprocess.TimeoutExpired:
        print(f"FAIL {name}: loom did not finish in 60 s")
        return 1
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    problems = []
    if p.returncode != 2:
        problems.append(f"exit status {p.returncode}, expected 2"
                        + (" (killed by a signal)" if p.returncode < 0 else ""))
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr, expected 1")
    msg = lines[0] if lines else ""
    if not msg.startswith("loom: error: "):
        problems.append("stderr does not start with 'loom: error: '")
    for n in needles:
        if n not in msg:
            problems.append(f"message lacks {n!r}")
    if alternatives and not any(a.lower() in msg.lower() for a in alternatives):
        problems.append(f"message has none of {list(alternatives)}")
    if problems:
        print(f"FAIL {name}: " + "; ".join(problems))
        for x in lines[:5]:
            print(f"     stderr: {x}")
        return 1
    print(f"ok   {name}: {msg}")
    return 0


def smoke(f):
    """A short real run: exit 0 and one metrics line per step with sane values."""
    metrics = f.path("smoke.jsonl")
    steps = 3
    args = ["train", "--data-path", f.good] + TINY + ["--metrics", metrics, "--log-interval", 1]
    args[args.index("--train-iters") + 1] = steps
    p = loom(*args)
    if p.returncode != 0:
        print(f"FAIL smoke run: exit status {p.returncode}: {p.stderr.strip()[-500:]}")
        return 1
    try:
        with open(metrics) as fh:
            lines = [json.loads(x) for x in fh if x.strip()]
    except (OSError, ValueError) as e:
        print(f"FAIL smoke run: metrics file: {e}")
        return 1
    train = [d for d in lines if "loss" in d]
    problems = []
    if [d.get("step") for d in train] != list(range(1, steps + 1)):
        problems.append(f"metrics steps {[d.get('step') for d in train]}, expected 1..{steps}")
    for d in train:
        for k in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
            if not isinstance(d.get(k), (int, float)) or not math.isfinite(d[k]):
                problems.append(f"step {d.get('step')}: {k} is {d.get(k)!r}")
        if isinstance(d.get("loss"), float) and not 0 < d["loss"] < 2 * math.log(V):
            problems.append(f"step {d['step']}: loss {d['loss']} is not plausible for V={V}")
        if not isinstance(d.get("mem"), dict) or "total" not in d["mem"]:
            problems.append(f"step {d.get('step')}: no mem.total")
    if problems:
        print("FAIL smoke run: " + "; ".join(problems[:5]))
        return 1
    print(f"ok   smoke run: {steps} steps, losses {[round(d['loss'], 4) for d in train]}")
    return 0


def main():
    if not lib.built(lib.LOOM):
        return 1
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        f = Files(tmp)
        data = ["--data-path", f.good]
        cases = [
            ("missing data file", ["train", "--data-path", f.missing] + TINY, [f.missing]),
            ("data path is a directory", ["train", "--data-path", f.directory] + TINY, [f.directory]),
            ("bad shard magic", ["train", "--data-path", f.bad_magic] + TINY, [f.bad_magic],
             ["magic", "20240520", "not a token shard", "header"]),
            ("truncated shard", ["train", "--data-path", f.truncated] + TINY, [f.truncated],
             ["truncat", "short", "expected", "bytes", "4096", "size"]),
            ("token id >= vocab size", ["train", "--data-path", f.big_token] + TINY, ["300"],
             ["vocab", "256"]),
            ("hidden size not divisible by heads",
             ["train"] + data + TINY + ["--hidden-size", 18, "--num-attention-heads", 4],
             ["--hidden-size", "--num-attention-heads"]),
            ("seq-length > max-position-embeddings",
             ["train"] + data + TINY + ["--seq-length", 16, "--max-position-embeddings", 8],
             ["--seq-length", "--max-position-embeddings"]),
            ("--kv-channels other than GPT-2's head width",
             ["train"] + data + TINY + ["--kv-channels", 4], ["--kv-channels", "4"], ["GPT-2"]),
            ("--kv-channels other than Llama's head width",
             ["train", "--model", "llama-tiny", "--train-iters", 1, "--eval-iters", 0, "--kv-channels", 16],
             ["--kv-channels", "16"], ["Llama"]),
            ("--backend that is not registered", ["train"] + data + TINY + ["--backend", "tpu"],
             ["--backend", "tpu"], ["cpu, guarded"]),
            ("unknown flag suggests the nearest", ["train"] + data + TINY + ["--num-layer", 2],
             ["--num-layer", "--num-layers"], ["did you mean"]),
            ("non-numeric value", ["train"] + data + TINY + ["--lr", "abc"], ["--lr", "abc"]),
            ("out-of-range value", ["train"] + data + TINY + ["--num-layers", 0], ["--num-layers", "0"]),
            ("--use-flash-attn beside the unfused kernel",
             ["train"] + data + TINY + ["--use-flash-attn", "--attention-backend", "local"],
             ["--use-flash-attn", "--attention-backend local"]),
            ("document masks without the fused attention",
             ["train"] + data + TINY + ["--reset-attention-mask", "--attention-backend", "unfused"],
             ["--reset-attention-mask", "--attention-backend unfused"]),
            ("an end-of-document token outside the vocabulary",
             ["train"] + data + TINY + ["--reset-position-ids", "--eod-token-id", 256],
             ["--eod-token-id 256", "256"], ["vocabulary"]),
            ("an unknown attention backend", ["train"] + data + TINY + ["--attention-backend", "sdpa"],
             ["--attention-backend", "sdpa"]),
            ("--load: missing tensor", ["train"] + data + TINY + ["--load", f.no_tensor],
             ["h.0.mlp.c_fc.bias"], ["missing", "not found", "no tensor"]),
            ("--load: wrong shape", ["train"] + data + TINY + ["--load", f.bad_shape],
             ["h.0.attn.c_proj.weight"], ["shape", "[16, 17]", "16, 17"]),
        ]
        for c in cases:
            fails += expect_error(*c)
        fails += smoke(f)
    return lib.verdict(fails)


if __name__ == "__main__":
    sys.exit(main())
