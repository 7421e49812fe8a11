#!/usr/bin/env python3
"""DeepSpeed JSON configs: `loom train --deepspeed-config F --dry-run` on
every config in examples/configs/, checking the resolved settings loom prints
(value and origin of each), then the bad configs (unknown key, wrong type,
out of range, inconsistent batch sizes, a flag over a JSON key, missing file,
invalid JSON), and that `loom train --help all` lists every setting with its
default and JSON key. A dry run opens no data and builds no model, so the
whole file takes seconds. Exits 1 on any failure.
"""
import glob
import json
import os
import re
import shutil
import sys
import tempfile

import lib
from lib import ENV, LOOM

CONFIGS = os.path.join(lib.ROOT, "examples", "configs")

# Mixed precision is not in the trainer yet, so configs that enable it must be
# refused with a clear error. When fp16/bf16 training lands, set this to True:
# those configs are then checked like the others, against EXPECTED.
MIXED_PRECISION = True
NEEDS_MIXED_PRECISION = {"zero2_offload_fp16.json": "fp16.enabled", "bf16.json": "bf16.enabled"}

# What each example resolves to at one rank: setting -> (value, origin), as in
# the printed table. Settings not listed are not checked.
EXPECTED = {
    "zero2_offload_fp16.json": {
        "global-batch-size": ("32", "json"), "gradient-accumulation-steps": ("4", "json"),
        "micro-batch-size": ("8", "derived"), "log-interval": ("10", "json"),
        "optimizer": ("adam", "json"), "lr": ("0.00015", "json"), "fp16": ("true", "json"),
        "zero-stage": ("2", "json"), "offload-optimizer": ("cpu", "json"),
    },
    "zero3_nvme.json": {
        "global-batch-size": ("64", "json"), "micro-batch-size": ("8", "json"),
        "gradient-accumulation-steps": ("8", "derived"), "log-interval": ("50", "json"),
        "clip-grad": ("1", "json"), "optimizer": ("adamw", "json"), "lr": ("0.0003", "json"),
        "adam-beta1": ("0.9", "json"), "adam-beta2": ("0.95", "json"), "adam-eps": ("1e-08", "json"),
        "weight-decay": ("0.1", "json"), "zero-stage": ("3", "json"), "no-overlap": ("false", "json"),
        "ddp-bucket-size": ("200", "json"),  # 5e7 fp32 elements
        "offload-optimizer": ("nvme", "json"), "nvme-path": ("/local_nvme", "json"),
        "lr-decay-style": ("cosine", "default"), "num-layers": ("4", "preset"),
    },
    "bf16.json": {
        "micro-batch-size": ("4", "json"), "gradient-accumulation-steps": ("8", "json"),
        "global-batch-size": ("32", "derived"), "bf16": ("true", "json"), "zero-stage": ("1", "json"),
        "lr": ("0.0006", "json"),
    },
    "warmup_decay.json": {
        "global-batch-size": ("16", "json"), "micro-batch-size": ("4", "json"),
        "gradient-accumulation-steps": ("4", "derived"), "seed": ("42", "json"),
        "lr-decay-style": ("WarmupDecayLR", "json"), "lr": ("0.001", "json"), "min-lr": ("0", "json"),
        "lr-warmup-iters": ("100", "json"), "lr-decay-iters": ("1200", "json"),
        "lr-warmup-style": ("linear", "json"), "adam-beta2": ("0.999", "json"),
        "weight-decay": ("0.01", "json"), "zero-stage": ("1", "json"), "train-iters": ("1200", "preset"),
    },
    "warmup_cosine.json": {
        "global-batch-size": ("32", "json"), "micro-batch-size": ("8", "json"),
        "gradient-accumulation-steps": ("4", "derived"), "optimizer": ("adam", "json"),
        "lr-decay-style": ("WarmupCosineLR", "json"), "lr": ("0.0003", "json"),
        "lr-warmup-iters": ("50", "json"), "lr-decay-iters": ("1200", "json"),
        "lr-warmup-style": ("log", "derived"),  # DeepSpeed's default
        "lr-warmup-min-ratio": ("0.01", "json"), "lr-cos-min-ratio": ("0.1", "json"),
        "zero-stage": ("2", "json"), "no-overlap": ("true", "json"), "ddp-bucket-size": ("2000", "json"),
    },
    "hf_trainer_auto.json": {
        # every "auto" falls back to loom's flags, preset and defaults
        "micro-batch-size": ("16", "preset"), "gradient-accumulation-steps": ("1", "derived"),
        "global-batch-size": ("16", "derived"), "lr": ("0.003", "preset"), "adam-beta1": ("0.9", "default"),
        "adam-beta2": ("0.95", "default"), "weight-decay": ("0.1", "default"), "clip-grad": ("1", "default"),
        "fp16": ("false", "default"), "bf16": ("false", "default"), "initial-loss-scale": ("65536", "json"),
        "lr-decay-style": ("WarmupLR", "json"), "lr-warmup-iters": ("100", "preset"),
        "lr-warmup-style": ("log", "derived"), "min-lr": ("0", "default"),
        "zero-stage": ("2", "json"), "offload-optimizer": ("cpu", "json"), "no-overlap": ("false", "json"),
        "ddp-bucket-size": ("25", "default"), "log-interval": ("2000", "json"), "optimizer": ("adamw", "json"),
    },
}


def fail(name, msg, p=None):
    lib.check(name, False, msg)
    if p is not None:
        for x in (p.stderr.strip().splitlines() + p.stdout.strip().splitlines())[:8]:
            print(f"     {x}")


def ok(name, msg=""):
    lib.check(f"{name}{': ' + msg if msg else ''}", True)


def loom(*args, cache=None, timeout=60):
    return lib.loom(*args, timeout=timeout, env=dict(ENV, XDG_CACHE_HOME=cache) if cache else ENV)


ROW = re.compile(r"^  (\S+) +(.*?) +\((default|preset|json|flag|derived|DeepSpeed's default|"
                 r"flag \(json had .*\))\)$")


def table(stdout):
    """The printed configuration: name -> (value, origin)."""
    rows = {}
    lines = stdout.splitlines()
    if "configuration:" not in lines:
        return rows
    for line in lines[lines.index("configuration:") + 1:]:
        m = ROW.match(line)
        if not m:
            break
        rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def warnings(p):
    return [x for x in p.stderr.splitlines() if x.startswith("loom: warning: ")]


def errors(p):
    return lib.error_lines(p.stderr)


def check_rows(name, rows, want):
    bad = [f"{k}: got {rows.get(k)}, want {v}" for k, v in want.items() if rows.get(k) != v]
    if bad:
        fail(name, "; ".join(bad[:6]))
        return False
    return True


def examples(cache):
    files = sorted(glob.glob(os.path.join(CONFIGS, "*.json")))
    if len(files) < 5:
        fail("examples", f"{len(files)} configs in {CONFIGS}, expected at least 5")
    for path in files:
        base = os.path.basename(path)
        name = f"example {base}"
        with open(path) as fh:
            json.load(fh)  # a plain JSON file, as DeepSpeed reads it
        if base not in EXPECTED:
            fail(name, "no expected values in tests/test_config_json.py")
            continue
        p = loom("train", "--deepspeed-config", path, "--dry-run", cache=cache)
        unknown = [w for w in warnings(p) if "unknown key" in w]
        if unknown:
            fail(name, f"keys loom does not know: {unknown}")
            continue
        if base in NEEDS_MIXED_PRECISION and not MIXED_PRECISION:
            key = NEEDS_MIXED_PRECISION[base]
            errs = errors(p)
            if p.returncode != 2 or len(errs) != 1 or key not in errs[0] or "not supported yet" not in errs[0]:
                fail(name, f"exit {p.returncode}, expected 2 with '{key}: ... not supported yet'", p)
            else:
                ok(name, errs[0])
            continue
        if p.returncode != 0:
            fail(name, f"exit {p.returncode}", p)
            continue
        if check_rows(name, table(p.stdout), EXPECTED[base]):
            ok(name, f"{len(EXPECTED[base])} settings as expected, {len(warnings(p))} warnings")


def write(tmp, name, obj):
    path = os.path.join(tmp, name)
    with open(path, "w") as fh:
        fh.write(obj if isinstance(obj, str) else json.dumps(obj, indent=2))
    return path


def expect_error(name, args, needles, cache):
    """Exit 2 and exactly one error line, containing every needle."""
    p = loom("train", *args, "--dry-run", cache=cache)
    errs = errors(p)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    problems = []
    if p.returncode != 2:
        problems.append(f"exit {p.returncode}, expected 2")
    if len(errs) != 1 or len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr ({len(errs)} errors), expected one error line")
    for n in needles:
        if not errs or n not in errs[0]:
            problems.append(f"error lacks {n!r}")
    if problems:
        fail(name, "; ".join(problems), p)
    else:
        ok(name, errs[0])


def bad_configs(tmp, cache):
    f = {
        "unknown": write(tmp, "unknown.json", {"train_batch_size": 8, "zero_optimization": {"stgae": 2},
                                                "optimiser": {"type": "AdamW"}}),
        "type": write(tmp, "type.json", {"zero_optimization": {"stage": "two"}}),
        "range": write(tmp, "range.json", {"zero_optimization": {"stage": 4}}),
        "batch": write(tmp, "batch.json", {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                                            "gradient_accumulation_steps": 4}),
        "lr": write(tmp, "lr.json", {"optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "seed": 5}),
        "invalid": write(tmp, "invalid.json", '{\n  "train_batch_size": 8,\n  "fp16": {"enabled": false,}\n}\n'),
        "ignored": write(tmp, "ignored.json", {"wall_clock_breakdown": True,
                                                "zero_optimization": {"stage": 1, "contiguous_gradients": True}}),
    }
    # unknown keys: a warning naming the full path and the nearest known key; the run goes on
    p = loom("train", "--deepspeed-config", f["unknown"], "--dry-run", cache=cache)
    ws = warnings(p)
    want = ["unknown key zero_optimization.stgae (nearest known key: zero_optimization.stage)",
            "unknown key optimiser (nearest known key: optimizer)"]
    missing = [w for w in want if not any(w in x for x in ws)]
    if p.returncode != 0 or missing:
        fail("unknown key", f"exit {p.returncode}; warnings lack {missing}", p)
    else:
        ok("unknown key", "; ".join(ws))
    expect_error("wrong type", ["--deepspeed-config", f["type"]],
                 [f["type"], "zero_optimization.stage: expected an integer, got 'two'"], cache)
    expect_error("out of range", ["--deepspeed-config", f["range"]],
                 [f["range"], "zero_optimization.stage: expected 0-3, got 4"], cache)
    expect_error("inconsistent batch sizes", ["--deepspeed-config", f["batch"]],
                 ["train_batch_size 32", "train_micro_batch_size_per_gpu 4", "gradient_accumulation_steps 4",
                  "data-parallel size 1"], cache)
    expect_error("missing file", ["--deepspeed-config", os.path.join(tmp, "nope.json")],
                 [os.path.join(tmp, "nope.json"), "No such file"], cache)
    expect_error("directory", ["--deepspeed-config", tmp], [tmp, "directory"], cache)
    expect_error("invalid JSON", ["--deepspeed-config", f["invalid"]], [f["invalid"], "not valid JSON", "line 3"], cache)
    # a flag that replaces one of the three: the message names each by where it came from
    p = loom("train", "--deepspeed-config", f["batch"], "--micro-batch-size", 8, "--dry-run", cache=cache)
    if p.returncode != 0 or table(p.stdout).get("micro-batch-size") != ("8", "flag (json had 4)"):
        fail("batch sizes made consistent by a flag", f"exit {p.returncode}", p)
    else:
        ok("batch sizes made consistent by a flag", "32 = 8 x 4 x 1")
    p = loom("train", "--deepspeed-config", f["batch"], "--micro-batch-size", 2, "--dry-run", cache=cache)
    errs = errors(p)
    want = "train_batch_size 32 != --micro-batch-size 2 x gradient_accumulation_steps 4 x data-parallel size 1"
    if p.returncode != 2 or len(errs) != 1 or want not in errs[0]:
        fail("batch sizes: a flag and the JSON disagree", f"exit {p.returncode}, expected 2 with {want!r}", p)
    else:
        ok("batch sizes: a flag and the JSON disagree", errs[0])
    # a flag over a JSON key with another value: the flag wins and the printout says so
    p = loom("train", "--deepspeed_config", f["lr"], "--lr", "0.002", "--seed", 5, "--dry-run", cache=cache)
    rows = table(p.stdout)
    note = [w for w in warnings(p) if "--lr 0.002 overrides optimizer.params.lr 0.001" in w]
    want = {"lr": ("0.002", "flag (json had 0.001)"), "seed": ("5", "flag"), "optimizer": ("adamw", "json")}
    if p.returncode != 0 or not note:
        fail("flag over JSON", f"exit {p.returncode}; override warning {'found' if note else 'missing'}", p)
    elif check_rows("flag over JSON", rows, want):
        ok("flag over JSON", f"lr {rows['lr']}; {note[0]}")
    # keys loom accepts but does not use: said once each, with what loom does
    p = loom("train", "--deepspeed-config", f["ignored"], "--dry-run", cache=cache)
    ws = warnings(p)
    counts = {k: sum(k + " is accepted, not used" in w for w in ws)
              for k in ("wall_clock_breakdown", "zero_optimization.contiguous_gradients")}
    if p.returncode != 0 or any(c != 1 for c in counts.values()):
        fail("accepted, not used", f"exit {p.returncode}; warnings per key {counts}", p)
    else:
        ok("accepted, not used", "; ".join(ws))


def dry_run_opens_nothing(tmp, cache):
    """A dry run resolves and prints, and creates no corpus, checkpoint or metrics file."""
    metrics = os.path.join(tmp, "m.jsonl")
    save = os.path.join(tmp, "ckpt")
    p = loom("train", "--deepspeed-config", os.path.join(CONFIGS, "warmup_decay.json"), "--dry-run",
             "--metrics", metrics, "--save", save, cache=cache)
    made = [x for x in (metrics, save) if os.path.exists(x)] + os.listdir(cache)
    if p.returncode != 0 or made or "configuration:" not in p.stdout or "step " in p.stdout:
        fail("dry run opens nothing", f"exit {p.returncode}; created {made}", p)
    else:
        ok("dry run opens nothing")


def deepspeed_defaults(cache, tmp):
    """DeepSpeed's fp16 defaults under its JSON (the loss scale starts at 2^16,
    not Megatron's 2^32, when the file leaves initial_scale_power out), the
    origin printed; flags keep Megatron's; integers in the forms JSON takes."""
    path = os.path.join(tmp, "fp16-seed.json")
    json.dump({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": True}}, open(path, "w"))
    for name, args, want in (
            ("a DeepSpeed JSON with fp16 and no initial_scale_power", ["--deepspeed-config", path],
             {"initial-loss-scale": ("65536", "DeepSpeed's default"), "fp16": ("true", "json")}),
            ("--fp16 as a flag (Megatron's default)", ["--fp16"], {"initial-loss-scale": ("4294967296", "default")}),
            ("the JSON and --initial-loss-scale 1024", ["--deepspeed-config", path, "--initial-loss-scale", "1024"],
             {"initial-loss-scale": ("1024", "flag")}),
            ("integers as JSON writes them: --zero3-min-params 1e6, --train-iters 1.5e3",
             ["--zero-stage", "3", "--zero3-min-params", "1e6", "--train-iters", "1.5e3"],
             {"zero3-min-params": ("1000000", "flag"), "train-iters": ("1500", "flag")})):
        p = loom("train", *args, "--dry-run", "--threads", "1", cache=cache)
        if p.returncode != 0:
            fail(name, f"exit {p.returncode}", p)
        elif check_rows(name, table(p.stdout), want):
            ok(name, ", ".join(f"{k} {v[0]} ({v[1]})" for k, v in want.items()))
    p = loom("train", "--train-iters", "2.5", "--dry-run", cache=cache)
    if p.returncode == 2 and "--train-iters" in p.stderr:
        ok("--train-iters 2.5 (not a whole number): exit 2 naming it")
    else:
        fail("--train-iters 2.5 (not a whole number): exit 2 naming it", f"exit {p.returncode}", p)


def dry_run_two_ranks(cache):
    """The batch invariant resolves with the real data-parallel size."""
    if not shutil.which("mpirun"):
        print("skip dry run at 2 ranks: no mpirun")
        return
    p = lib.run_ranks(2, [LOOM, "train", "--deepspeed-config", os.path.join(CONFIGS, "zero3_nvme.json"), "--dry-run",
                          "--threads", "1"], expect=None, timeout=120, env=dict(ENV, XDG_CACHE_HOME=cache))
    rows = table(p.stdout)
    if p.returncode != 0 or p.stdout.count("configuration:") != 1:
        fail("dry run at 2 ranks", f"exit {p.returncode}; {p.stdout.count('configuration:')} tables printed", p)
    elif check_rows("dry run at 2 ranks", rows, {"global-batch-size": ("64", "json"), "micro-batch-size": ("8", "json"),
                                                 "gradient-accumulation-steps": ("4", "derived")}):
        ok("dry run at 2 ranks", "64 = 8 x 4 x 2")


def help_lists_everything(cache):
    p = loom("train", "--deepspeed-config", os.path.join(CONFIGS, "warmup_decay.json"), "--dry-run", cache=cache)
    names = list(table(p.stdout))
    for cmd in ("train", "eval"):
        h = loom(cmd, "--help", "all")
        lines = h.stdout.splitlines()
        missing, no_default = [], []
        for n in names:
            at = [i for i, x in enumerate(lines) if x.startswith(f"  --{n} ") or x.rstrip() == f"  --{n}"]
            if not at:
                missing.append(n)
            elif at[0] + 1 >= len(lines) or "[default: " not in lines[at[0] + 1]:
                no_default.append(n)
        json_keys = ["json: train_micro_batch_size_per_gpu", "json: zero_optimization.stage",
                     "json: optimizer.params.lr, scheduler.params.warmup_max_lr", "json: fp16.initial_scale_power",
                     "json: zero_optimization.reduce_bucket_size", "json: optimizer.params.betas[0]"]
        no_json = [k for k in json_keys if k not in h.stdout]
        if h.returncode != 0 or len(names) < 60 or missing or no_default or no_json:
            fail(f"loom {cmd} --help all", f"exit {h.returncode}; {len(names)} settings; missing {missing}; "
                 f"without default {no_default}; without JSON key {no_json}")
        else:
            ok(f"loom {cmd} --help all", f"all {len(names)} settings with default and JSON key")


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        os.mkdir(cache)
        examples(cache)
        bad_configs(tmp, cache)
        dry_run_opens_nothing(tmp, cache)
        dry_run_two_ranks(cache)
        deepspeed_defaults(cache, tmp)
        help_lists_everything(cache)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
