"""loom plan on any input: an answer in seconds, never a signal.

1. The cases that broke it: a global batch of 16777216 sequences on 4096
   ranks (an int product that wrapped to 0 and a division by it), on 8
   ranks (a micro-batch past --micro-batch-size's range, a size that went
   negative), on 1048576 ranks, and a step of 131072 sequences on 8 ranks
   (every micro-batch of every candidate replayed: a minute): each answers
   within 10 s with a layout, and a batch that looks like tokens is named.
   The 10 s are CPU seconds (user and system) of the loom process, which
   load beside it does not stretch; a wall-clock timeout catches a hang.
2. Random flags, seeded (LOOM_PLAN_SEED, default 1): world, batch sizes,
   sequence length, model shape, layout constraints, memory, precision,
   huge, zero, negative and non-numeric values. Each run ends within 10 s
   with exit 0 and a result, or exit 2 and exactly one line on stderr;
   a failing case prints its command.
3. --layout auto in loom train takes the same search: a huge global batch
   answers in seconds, a bad one in one line.
"""
import os
import random
import subprocess
import sys
import tempfile
import time

import lib

LIMIT = 10.0
CLUSTER = ["--cluster", "a100-80gb"]


def timed(cmd, timeout):
    """cmd run to its end: (CompletedProcess or None when it passed timeout
    seconds of wall time, CPU seconds, why). The CPU time (user and system)
    is what the 10 s are held to: a loaded machine stretches the wall clock,
    not the work; the wall-clock timeout only catches a hang."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([str(a) for a in cmd], stdout=out, stderr=err, text=True)
        deadline = time.time() + timeout
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                proc.kill()
                _, status, ru = os.wait4(proc.pid, 0)
                return None, ru.ru_utime + ru.ru_stime, f"no answer in {timeout} s of wall time"
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        cp = subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
        return cp, ru.ru_utime + ru.ru_stime, ""


def run_plan(args, timeout=60):
    return timed([lib.LOOM, "plan", *args], timeout)


def judge(name, args, p, secs, why=""):
    """exit 0 with a result, or exit 2 with one stderr line; within LIMIT."""
    cmd = "loom plan " + " ".join(args)
    if p is None:
        return lib.check(name, False, f"{cmd}: no answer in {secs:.1f} s ({why})")
    if p.returncode == 0:
        ok = "layouts considered" in p.stdout or p.stdout.lstrip().startswith("{")
        detail = f"exit 0 without a result: {p.stdout[-300:]}"
    elif p.returncode == 2:
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        ok = len(lines) == 1 and lines[0].startswith("loom: error:")
        detail = f"exit 2 with {len(lines)} lines: {p.stderr[-400:]}"
    else:
        ok, detail = False, f"exit {p.returncode}: {p.stderr[-400:]}"
    if ok and secs > LIMIT:
        ok, detail = False, f"exit {p.returncode} after {secs:.1f} s of CPU, above {LIMIT:.0f} s"
    return lib.check(name, ok, f"{cmd}: {detail} ({secs:.1f} s of CPU)")


def cases_section():
    print("1. the inputs that broke the planner")
    for world in (4096, 8, 1048576):
        args = ["--model", "gpt2", "--world", str(world), "--global-batch-size", "16777216", *CLUSTER]
        p, secs, why = run_plan(args, timeout=60)
        judge(f"gpt2, 16777216 sequences on {world} ranks: answered", args, p, secs, why)
        if p is not None:
            lib.check(f"  a layout, and the batch named as likely tokens (16384 sequences)",
                      p.returncode == 0 and "recommended: " in p.stdout and "--global-batch-size 16384" in p.stderr,
                      f"exit {p.returncode}: {p.stderr[-300:]}")
    args = ["--model", "gpt2", "--world", "8", "--global-batch-size", "131072", *CLUSTER]
    p, secs, why = run_plan(args, timeout=120)
    judge("gpt2, 131072 sequences on 8 ranks: answered", args, p, secs, why)
    args = ["--model", "gpt2", "--world", "1", "--global-batch-size", "16777216", "--micro-batch-size", "1", *CLUSTER]
    p, secs, why = run_plan(args, timeout=60)
    if judge("16777216 micro-batches a step: answered", args, p, secs, why):
        lib.check("  the layout is listed rejected with the bound", p.returncode == 0 and
                  "micro-batches a step: the planner tries up to" in p.stdout, p.stdout[-400:])


def value(rng, kind):
    """A random value for a flag: mostly sensible, sometimes extreme or junk."""
    junk = ["0", "-1", "-4096", "x", "", "1e3", "2147483647", "2147483648", "99999999999", "0x10", " 4"]
    r = rng.random()
    if r < 0.04:
        return rng.choice(junk)
    if kind == "world":
        return str(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 64, 96, 256, 1024, 4096, 65536, 1 << 20]))
    if kind == "batch":
        return str(rng.choice([1, 2, 3, 7, 8, 64, 512, 1536, 4096, 65536, 1 << 20, 1 << 24, 3 << 22]))
    if kind == "micro":
        return str(rng.choice([1, 2, 3, 4, 16, 1024, 1 << 20]))
    if kind == "small":
        return str(rng.choice([1, 2, 3, 4, 8, 16, 64]))
    if kind == "seq":
        return str(rng.choice([1, 16, 64, 128, 1024, 4096, 1 << 20]))
    if kind == "layers":
        return str(rng.choice([1, 2, 12, 48, 96, 1024]))
    if kind == "mem":
        return rng.choice(["0.001", "1", "80", "1e6", "1e15", "nan", "inf"])
    return "1"


FLAGS = [("--world", "world"), ("--global-batch-size", "batch"), ("--micro-batch-size", "micro"),
         ("--seq-length", "seq"), ("--num-layers", "layers"), ("--tensor-model-parallel-size", "small"),
         ("--pipeline-model-parallel-size", "small"), ("--zero-stage", "small"),
         ("--num-layers-per-virtual-pipeline-stage", "small"), ("--mem-per-rank", "mem"),
         ("--gradient-accumulation-steps", "micro"), ("--layout-invariant", "small"), ("--top", "small")]
SWITCHES = [["--sequence-parallel"], ["--bf16"], ["--fp16"], ["--recompute-granularity", "full"],
            ["--recompute-granularity", "selective"], ["--json"], ["--rejected"], ["--precision", "f32,bf16,fp16"],
            ["--precision", "bf16,x"], ["--cluster", "h100-80gb"], ["--cluster", "a100-40gb"]]
MODELS = ["gpt2-tiny", "gpt2", "gpt2", "gpt2-medium", "llama-tiny", "llama-tiny", "nosuch"]


def random_section(n):
    seed = int(os.environ.get("LOOM_PLAN_SEED", "1"))
    print(f"2. {n} random inputs (seed {seed})")
    rng = random.Random(seed)
    bad = slowest = 0
    answers = {}
    for i in range(n):
        args = ["--model", rng.choice(MODELS)]
        for flag, kind in rng.sample(FLAGS, rng.randint(1, 4)):
            args += [flag, value(rng, kind)]
        for sw in rng.sample(SWITCHES, rng.randint(0, 2)):
            args += sw
        if "--cluster" not in args:
            args += CLUSTER
        if "--global-batch-size" not in args and rng.random() < 0.8:
            args += ["--global-batch-size", value(rng, "batch")]
        p, secs, why = run_plan(args)
        slowest = max(slowest, secs)
        answers[p.returncode if p else None] = answers.get(p.returncode if p else None, 0) + 1
        if not judge(f"random input {i}", args, p, secs, why):
            bad += 1
    print(f"   slowest answer {slowest:.2f} s of CPU; exit statuses {answers}")
    return bad


def layout_auto_section(tmp):
    print("3. --layout auto takes the same search")
    base = [lib.LOOM, "train", "--model", "gpt2-tiny", "--layout", "auto", "--train-iters", "1", "--eval-iters", "0",
            "--threads", "1", "--dry-run"]
    p, secs, why = timed(base + ["--global-batch-size", "16777216"], 120)
    lib.check("a global batch of 16777216 sequences: an answer within 10 s of CPU, no signal",
              p is not None and p.returncode in (0, 1, 2) and secs <= LIMIT,
              why or f"exit {p.returncode} in {secs:.1f} s of CPU: {p.stderr[-400:]}")
    p = lib.run(base + ["--global-batch-size", "-5"], timeout=60)
    errs = lib.error_lines(p.stderr)
    lib.check("a negative global batch: exit 2, one line", p.returncode == 2 and len(errs) == 1,
              f"exit {p.returncode}: {p.stderr[-300:]}")


def main():
    if not lib.built(lib.LOOM):
        return 1
    cases_section()
    random_section(int(os.environ.get("LOOM_PLAN_CASES", "60")))
    layout_auto_section(None)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
