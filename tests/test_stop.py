"""Graceful stop: SIGTERM or SIGINT (to one rank or every rank, as a
scheduler signals every task),
--exit-interval and --exit-duration-in-mins stop the run at a step boundary
that every rank agrees on, save a checkpoint and exit 0 within a few
seconds; resuming from it continues exactly (the final weights and Adam
moments equal an uninterrupted run's bit for bit). A second signal ends the
process at once. Without --save the stop says that nothing was saved.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import lib
from lib import ENV, LOOM, check
from pyref import ckpt

STEPS = 3000  # long enough (seconds) for a signal to land mid-run


def args(tmp, save, metrics, marker, iters=STEPS):
    return ["--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL, "--global-batch-size", "4",
            "--micro-batch-size", "2", "--train-iters", str(iters), "--lr", "3e-3", "--log-interval", "1",
            "--eval-iters", "0", "--threads", "1", "--seed", "7", "--metrics", metrics, "--save", save,
            "--comm-timeout", "60", "--data-cache", marker]


def start(tmp, tag, n, extra=(), env=ENV):
    save, metrics, marker = (os.path.join(tmp, tag + x) for x in ("-save", ".jsonl", "-marker"))
    cmd = lib.mpirun(n, [LOOM, "train"] + args(tmp, save, metrics, marker) + list(extra))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return p, save, metrics, marker


def wait_steps(p, metrics, k, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None and len(lib.metrics_rows(metrics)) < k:
        time.sleep(0.05)
    return len(lib.metrics_rows(metrics)) >= k



def same_state(a, b):
    x, y = ckpt.assemble(a), ckpt.assemble(b)
    return x.keys() == y.keys() and all(lib.same_bits(x[k], y[k]) for k in x)


def resume_equals(tmp, tag, n, save, full):
    """Resumes save to the end and compares with the uninterrupted run."""
    metrics, marker = os.path.join(tmp, tag + "-resume.jsonl"), os.path.join(tmp, tag + "-resume-marker")
    lib.run_ranks(n, [LOOM, "train"] + args(tmp, save, metrics, marker) + ["--load", save], tag=tag + " resume")
    return same_state(save, full)


def signal_case(tmp, tag, n, full, sig, ranks):
    """sig to the ranks in `ranks`."""
    p, save, metrics, marker = start(tmp, tag, n)
    if not check(f"{tag}: running", wait_steps(p, metrics, 3)):
        p.kill()
        return
    victims = [pid for pid, rank in lib.loom_ranks(marker).items() if rank in ranks]
    for pid in victims:
        os.kill(pid, sig)
    out, err, took = lib.finish(p, 30)
    stopped = [l for l in out.splitlines() if l.startswith("stopped after step")]
    check(f"{tag}: exit 0 in {took:.1f} s (<= 10 s)", p.returncode == 0 and took <= 10, err[-500:])
    name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
    check(f"{tag}: one line says why and when ({stopped[0] if stopped else ''})",
          len(stopped) == 1 and name in stopped[0], out[-500:])
    step = len(lib.metrics_rows(metrics))
    check(f"{tag}: stopped early (step {step} of {STEPS}), its checkpoint saved at that step",
          step < STEPS and os.path.exists(os.path.join(save, f"iter_{step:07d}")), str(os.listdir(save)))
    check(f"{tag}: the resumed run ends with the uninterrupted run's weights and moments, bit for bit",
          resume_equals(tmp, tag, n, save, full))


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        fulls = {}
        for n in (1, 2):
            save = os.path.join(tmp, f"full{n}")
            lib.run_ranks(n, [LOOM, "train"] + args(tmp, save, os.path.join(tmp, f"full{n}.jsonl"),
                                                    os.path.join(tmp, f"full{n}-m")), tag=f"full {n}")
            fulls[n] = save
        signal_case(tmp, "SIGTERM, one process", 1, fulls[1], signal.SIGTERM, {0})
        signal_case(tmp, "SIGINT, one process", 1, fulls[1], signal.SIGINT, {0})
        signal_case(tmp, "SIGTERM to every rank of 2", 2, fulls[2], signal.SIGTERM, {0, 1})
        signal_case(tmp, "SIGTERM to rank 1 of 2 alone", 2, fulls[2], signal.SIGTERM, {1})

        # --exit-interval: after step 7, a checkpoint, exit 0; then the rest
        save, metrics = os.path.join(tmp, "interval"), os.path.join(tmp, "interval.jsonl")
        p = lib.run_ranks(2, [LOOM, "train"] + args(tmp, save, metrics, os.path.join(tmp, "i-m")) +
                          ["--exit-interval", "7"], tag="exit interval")
        check("--exit-interval 7: stops after step 7 with its checkpoint, exit 0",
              len(lib.metrics_rows(metrics)) == 7 and os.path.exists(os.path.join(save, "iter_0000007")) and
              "stopped after step 7 of 3000: --exit-interval" in p.stdout, p.stdout[-400:])
        check("--exit-interval: resumed, it ends with the uninterrupted run's state",
              resume_equals(tmp, "interval", 2, save, fulls[2]))

        # --exit-duration-in-mins: a duration shorter than a step stops after the first
        save, metrics = os.path.join(tmp, "duration"), os.path.join(tmp, "duration.jsonl")
        p = lib.run_ranks(1, [LOOM, "train"] + args(tmp, save, metrics, os.path.join(tmp, "d-m")) +
                          ["--exit-duration-in-mins", "1e-6"], tag="exit duration")
        check("--exit-duration-in-mins: stops at the first step boundary past it, with a checkpoint",
              len(lib.metrics_rows(metrics)) == 1 and os.path.exists(os.path.join(save, "iter_0000001")) and
              "--exit-duration-in-mins" in p.stdout, p.stdout[-400:])

        # without --save
        metrics = os.path.join(tmp, "nosave.jsonl")
        cmd = [a for a in args(tmp, "X", metrics, os.path.join(tmp, "n-m")) if a not in ("--save", "X")]
        p = lib.run_ranks(1, [LOOM, "train"] + cmd + ["--exit-interval", "2"], tag="no save")
        check("without --save: stops, says nothing was saved, exit 0",
              "stopped after step 2 of 3000: --exit-interval (no --save: nothing saved)" in p.stdout, p.stdout[-300:])

        # a second signal ends the process at once: the first lands in a
        # stalled step (LOOM_TEST_STALL pauses rank 0 before step 3)
        p, save, metrics, marker = start(tmp, "twice", 1, env=dict(ENV, LOOM_TEST_STALL="0:3"))
        wait_steps(p, metrics, 2)
        time.sleep(0.5)
        pids = list(lib.loom_ranks(marker))
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.3)
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        _, _, took = lib.finish(p, timeout=10)
        check(f"a second SIGTERM ends the process at once ({took:.1f} s), killed by it",
              took <= 5 and p.returncode == -signal.SIGTERM, f"exit {p.returncode}")
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
