"""Distributed failures end the job cleanly: a rank killed mid-run, a rank
that stops answering (the communication deadline and its hang report: every
rank's line, the ranks that never reached the collective), the same report
at once on SIGTERM to a hung job, SIGUSR1's progress line, layouts that do not
divide, ranks started with different settings, `loom eval` (one process)
started on two ranks, and the launcher, with --max-restarts: a rank killed
mid-run and the job resumed from the newest checkpoint ends with the
uninterrupted run's state bit for bit; a fault on every attempt uses the
restarts up (exit 1); bad input is not restarted (exit 2)."""
import os
import signal
import subprocess
import sys
import tempfile
import time

import lib
from lib import ENV, LOOM, check


def model_args(tmp, iters=4):
    return ["--data-path", os.path.join(tmp, "train.bin"), "--num-layers", "1", "--hidden-size", "32",
            "--num-attention-heads", "2", "--seq-length", "16", "--vocab-size", "256", "--train-iters",
            str(iters), "--eval-iters", "0", "--threads", "1", "--log-interval", "1"]


def train_on(n, args, timeout=60, env=ENV, extra=()):
    """`loom train ARGS` on n ranks, whatever its exit status."""
    return lib.run_ranks(n, [LOOM, "train"] + args, expect=None, timeout=timeout, env=env, mpi_args=extra)


def test_kill(tmp):
    metrics = os.path.join(tmp, "kill.jsonl")
    marker = os.path.join(tmp, "kill-marker")
    args = model_args(tmp, iters=100000) + ["--metrics", metrics, "--data-cache", marker]
    p = subprocess.Popen(lib.mpirun(2, [LOOM, "train"] + args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=ENV)
    deadline = time.time() + 60
    while time.time() < deadline and (not os.path.exists(metrics) or len(lib.metrics_rows(metrics)) < 2):
        time.sleep(0.2)
    victims = [pid for pid, rank in lib.loom_ranks(marker).items() if rank == 1]
    check("kill: rank 1 found running", len(victims) == 1, str(lib.loom_ranks(marker)))
    if not victims:
        p.kill()
        return
    t0 = time.time()
    os.kill(victims[0], signal.SIGKILL)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    took = time.time() - t0
    check(f"kill: job ended in {took:.1f} s (<= 10 s)", took <= 10)
    check(f"kill: exit status {p.returncode} is non-zero", p.returncode != 0)
    check("kill: stderr names rank 1", "rank 1" in err, err[-500:])
    time.sleep(0.5)
    check("kill: no process left behind", not lib.loom_ranks(marker), str(lib.loom_ranks(marker)))


def test_stall(tmp):
    """Rank 1 of 3 stops answering before step 2: the deadline's hang report."""
    env = dict(ENV, LOOM_TEST_STALL="1:2")
    t0 = time.time()
    p = train_on(3, model_args(tmp) + ["--comm-timeout", "2"], env=env, extra=["-x", "LOOM_TEST_STALL"], timeout=60)
    took = time.time() - t0
    lines = [l for l in lib.error_lines(p.stderr) if "communication timeout" in l]
    check(f"stall: exit status {p.returncode} is 1", p.returncode == 1, p.stderr[-500:])
    check(f"stall: ended in {took:.1f} s (deadline 2 s)", took <= 20)
    check("stall: message names rank, group, collective and its number, bytes, step",
          bool(lines) and all(s in lines[0] for s in ("all-reduce #", "dp group", "bytes", "step 2")),
          "; ".join(lines) or p.stderr[-500:])
    report = [l for l in p.stderr.splitlines() if l.startswith("loom: hang report:")]
    own = {r: [l for l in report if f"[rank {r} on " in l] for r in range(3)}
    check("stall: every rank that can speak prints one line with its host, step and last completed collective",
          all(len(own[r]) == 1 and "last completed: all-reduce #" in own[r][0] for r in range(3)), "\n".join(report))
    check("stall: the waiting ranks say what they wait in, and for how long",
          all("waiting in all-reduce #" in own[r][0] and " s; " in own[r][0] for r in (0, 2)), "\n".join(report))
    check("stall: the stalled rank says it is in no collective, at step 1",
          own[1] and "in no collective" in own[1][0] and "at step 1" in own[1][0], "\n".join(report))
    summary = [l for l in report if "never reached" in l]
    check("stall: the ranks that never reached the collective are named: rank 1",
          bool(summary) and all("never reached all-reduce #" in l and ": 1 (" in l for l in summary),
          "\n".join(report))


def test_sigterm_while_hung(tmp):
    """A scheduler's SIGTERM on a hung job (rank 1 of 3 stalls before step 2,
    the deadline far away): the waiting ranks report at once what they wait
    in and name rank 1 as never reaching it; a second SIGTERM ends the job."""
    metrics, marker = os.path.join(tmp, "term.jsonl"), os.path.join(tmp, "term-marker")
    args = model_args(tmp, iters=50) + ["--comm-timeout", "300", "--metrics", metrics, "--data-cache", marker]
    p = subprocess.Popen(lib.mpirun(3, [LOOM, "train"] + args, ["-x", "LOOM_TEST_STALL"]),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=dict(ENV, LOOM_TEST_STALL="1:2"))
    deadline = time.time() + 60
    while time.time() < deadline and len(lib.metrics_rows(metrics)) < 1:
        time.sleep(0.05)
    time.sleep(1)
    ranks = lib.loom_ranks(marker)
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    time.sleep(3)
    t0 = time.time()
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    _, err, _ = lib.finish(p, 60)
    took = time.time() - t0
    report = [l for l in err.splitlines() if l.startswith("loom: hang report:")]
    summary = [l for l in report if "never reached" in l]
    check("SIGTERM while rank 1 hangs: ranks 0 and 2 say a stop signal came while they wait, and what they wait in",
          all(any(f"[rank {r}] a stop signal came" in l for l in report) and
              any(f"[rank {r} on " in l and "waiting in all-reduce #" in l for l in report) for r in (0, 2)),
          "\n".join(report) or err[-500:])
    check("SIGTERM while rank 1 hangs: both name rank 1 as never reaching the collective, at step 1",
          len(summary) == 2 and all(": 1 (on " in l and "at step 1" in l for l in summary), "\n".join(report))
    check(f"SIGTERM while rank 1 hangs: a second SIGTERM ends the job ({took:.1f} s, exit {p.returncode})",
          p.returncode != 0 and took <= 10, err[-300:])
    time.sleep(0.5)
    check("SIGTERM while rank 1 hangs: no process left behind", not lib.loom_ranks(marker),
          str(lib.loom_ranks(marker)))


def test_sigusr1(tmp):
    """SIGUSR1 prints a rank's progress line; the run goes on."""
    metrics, marker = os.path.join(tmp, "usr1.jsonl"), os.path.join(tmp, "usr1-marker")
    args = model_args(tmp, iters=400) + ["--metrics", metrics, "--data-cache", marker]
    p = subprocess.Popen(lib.mpirun(2, [LOOM, "train"] + args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=ENV)
    deadline = time.time() + 60
    while time.time() < deadline and len(lib.metrics_rows(metrics)) < 5:
        time.sleep(0.05)
    for pid, rank in lib.loom_ranks(marker).items():
        if rank == 1:
            os.kill(pid, signal.SIGUSR1)
            # what a write to a dead peer's socket raises: the rank must not die of it (a rank killed by
            # SIGPIPE made mpirun blame its host for another host's death)
            os.kill(pid, signal.SIGPIPE)
    _, err = p.communicate(timeout=120)
    lines = [l for l in err.splitlines() if l.startswith("loom: progress: [rank 1 on ")]
    check("SIGUSR1 and SIGPIPE: rank 1 prints its progress line and the run finishes (exit 0)",
          p.returncode == 0 and len(lines) == 1 and "last completed" in lines[0] and
          len(lib.metrics_rows(metrics)) == 400, err[-500:])
    # one process: no communication thread, the step loop prints it
    metrics, marker = os.path.join(tmp, "usr1-one.jsonl"), os.path.join(tmp, "usr1-one-marker")
    args = model_args(tmp, iters=400) + ["--metrics", metrics, "--data-cache", marker]
    p = subprocess.Popen([LOOM, "train"] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=ENV)
    deadline = time.time() + 60
    while time.time() < deadline and len(lib.metrics_rows(metrics)) < 5:
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR1)
    _, err = p.communicate(timeout=120)
    lines = [l for l in err.splitlines() if l.startswith("loom: progress: [rank 0 on ")]
    check("SIGUSR1, one process: its progress line (the step) and the run finishes (exit 0)",
          p.returncode == 0 and len(lines) == 1 and "at step " in lines[0] and len(lib.metrics_rows(metrics)) == 400,
          err[-500:])


def test_layouts(tmp):
    cases = [
        ("world not divisible by tp x pp", 2, ["--tensor-model-parallel-size", "3"],
         "world size 2 is not divisible by tensor-parallel size 3 x pipeline-parallel size 1"),
        ("world not divisible by pp", 4, ["--pipeline-model-parallel-size", "3"],
         "world size 4 is not divisible by tensor-parallel size 1 x pipeline-parallel size 3"),
        ("global batch not divisible by micro x dp", 2, ["--global-batch-size", "6", "--micro-batch-size", "2"],
         "--global-batch-size 6 is not divisible by --micro-batch-size 2 x data-parallel size 2"),
        ("batch sizes disagree", 2, ["--global-batch-size", "8", "--micro-batch-size", "2",
                                     "--gradient-accumulation-steps", "3"], "batch sizes disagree"),
        ("an unknown flag, said once, not by every rank", 2, ["--bogus-flag", "1"], "unknown flag --bogus-flag"),
        ("a --load path that does not exist, said once", 2, ["--load", "MISSING"], "MISSING"),
    ]
    for name, n, flags, needle in cases:
        p = train_on(n, model_args(tmp) + flags)
        lines = lib.error_lines(p.stderr)
        check(f"layout: {name}: exit {p.returncode} == 2, one error line naming it",
              p.returncode == 2 and len(lines) == 1 and needle in lines[0], p.stderr[-600:])


def test_eval_one_process(tmp):
    """loom eval is one process: under mpirun every rank learns the world size and it refuses once."""
    save = os.path.join(tmp, "eval-ckpt")
    lib.run_ranks(1, [LOOM, "train"] + model_args(tmp, iters=1) + ["--save", save], tag="eval-ckpt")
    p = lib.run_ranks(2, [LOOM, "eval", "--load", save, "--data-path", os.path.join(tmp, "train.bin"),
                          "--valid-data-path", os.path.join(tmp, "train.bin"), "--eval-iters", "1"], expect=None)
    lines = lib.error_lines(p.stderr)
    check(f"eval on 2 ranks: exit {p.returncode} == 2, one error line naming the ranks",
          p.returncode == 2 and len(lines) == 1 and "loom eval runs in one process (got 2 ranks)" in lines[0],
          p.stderr[-600:])


def test_config_mismatch(tmp):
    base = model_args(tmp)
    cmd = ["mpirun", "--bind-to", "none", "-np", "1", LOOM, "train"] + base + ["--lr", "1e-3", ":",
           "-np", "1", LOOM, "train"] + base + ["--lr", "2e-3"]
    p = lib.run(cmd, timeout=60, env=ENV)
    lines = lib.error_lines(p.stderr)
    check(f"mismatch: exit {p.returncode} == 2, error names --lr",
          p.returncode == 2 and len(lines) == 1 and "ranks disagree on --lr" in lines[0], p.stderr[-600:])


def test_launch(tmp):
    metrics = os.path.join(tmp, "launch.jsonl")
    p = lib.loom("launch", "--nproc-per-node", "2", "--", "train", *model_args(tmp), "--metrics", metrics)
    rows = lib.metrics_rows(metrics)
    check(f"launch: 2 ranks train, exit {p.returncode} == 0", p.returncode == 0 and "ranks: 2" in p.stdout,
          p.stderr[-600:])
    check("launch: metrics carry per-rank memory",
          bool(rows) and "mem_by_rank" in rows[0] and len(rows[0]["mem_by_rank"]) == 2, str(rows[:1]))
    p = lib.loom("launch", "--nproc-per-node", "0", "--", "train")
    check("launch: bad --nproc-per-node is exit 2", p.returncode == 2 and "--nproc-per-node" in p.stderr)


def test_restarts(tmp):
    """loom launch --max-restarts: a rank killed mid-run, the job resumes from
    the newest checkpoint and ends with the uninterrupted run's state."""
    from pyref import ckpt

    def launch(tag, extra=(), restarts=1, env=ENV):
        save, marker = os.path.join(tmp, tag), os.path.join(tmp, tag + "-marker")
        metrics = os.path.join(tmp, tag + ".jsonl")
        cmd = [LOOM, "launch", "--nproc-per-node", "2", "--max-restarts", str(restarts), "--", "train",
               *model_args(tmp, iters=300), "--seed", "7", "--save", save, "--save-interval", "40", "--metrics",
               metrics, "--data-cache", marker, "--comm-timeout", "5", *extra]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env), save, \
            metrics, marker

    p, full, _, _ = launch("restart-full")
    out, err = p.communicate(timeout=300)
    check("restarts: the uninterrupted run through loom launch --max-restarts, exit 0", p.returncode == 0,
          err[-500:])
    p, save, metrics, marker = launch("restart-killed")
    deadline = time.time() + 60
    while time.time() < deadline and len(lib.metrics_rows(metrics)) < 60:
        time.sleep(0.05)
    victims = [pid for pid, rank in lib.loom_ranks(marker).items() if rank == 1]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=300)
    lines = [l for l in err.splitlines() if l.startswith("loom launch: restart")]
    check(f"restarts: rank 1 killed, the job restarted once and finished, exit {p.returncode}",
          len(victims) == 1 and p.returncode == 0 and len(lines) == 1 and "restart 1 of 1" in lines[0] and
          "resuming from the newest intact checkpoint" in lines[0], err[-800:])
    check("restarts: the reason names the killed rank", lines and "rank 1" in lines[0], lines)
    check("restarts: the resumed run printed where it resumed", "resumed at step 41" in out or
          "resumed at step 81" in out, out[-400:])
    a, b = ckpt.assemble(full), ckpt.assemble(save)
    check("restarts: final weights and moments equal the uninterrupted run's, bit for bit",
          a.keys() == b.keys() and all(lib.same_bits(a[k], b[k]) for k in a), str(lib.differing(a, b))[:300])
    # a fault every time: the restarts run out (rank 1 stalls before step 5, each attempt)
    p, save, _, _ = launch("restart-stall", env=dict(ENV, LOOM_TEST_STALL="1:5"))
    out, err = p.communicate(timeout=120)
    errs = lib.error_lines(err)
    check(f"restarts: a fault on every attempt ends with exit 1 once --max-restarts is used up",
          p.returncode == 1 and "--max-restarts 1 used up" in err and errs and "failed 2 times" in errs[-1],
          err[-800:])
    p = lib.loom("launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", "train", *model_args(tmp))
    check("restarts: --max-restarts without --save is exit 2 naming it",
          p.returncode == 2 and "--max-restarts needs --save" in p.stderr, p.stderr[-300:])
    p = lib.loom("launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", "train", *model_args(tmp),
                 "--save", os.path.join(tmp, "bad"), "--lr", "x")
    check("restarts: bad input is not restarted (exit 2)", p.returncode == 2 and "restart 1" not in p.stderr,
          p.stderr[-300:])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.synth(tmp, 100000)
        test_layouts(tmp)
        test_eval_one_process(tmp)
        test_config_mismatch(tmp)
        test_stall(tmp)
        test_sigterm_while_hung(tmp)
        test_sigusr1(tmp)
        test_kill(tmp)
        test_launch(tmp)
        test_restarts(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
