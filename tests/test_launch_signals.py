"""`loom launch` under signals, and where its runs resume from.

- SIGTERM or SIGINT to the launcher (not to mpirun, not to the ranks) stops
  the job at a step boundary: a checkpoint at the stop, no process of the
  job left, the save directory's lock free, exit 0; with --max-restarts 2
  the signal is not followed by a restart. The same command launched again
  resumes from --save, its steps' losses those of an uninterrupted run bit
  for bit.
- The launcher SIGKILLed: the job stops as on a signal (saves, exits)
  instead of training on unsupervised. SIGUSR2 to a plain mpirun stops the
  job the same way (mpirun forwards it).
- A restart resumes from --save, not from a --load among the train
  arguments; --save=DIR and a DeepSpeed JSON's "save" are the launcher's
  --save as well.
"""
import fcntl
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import lib
from lib import ENV, LOOM, check

STEPS = 600  # long enough for a signal to land mid-run (it lands within ~10 steps)


def train_args(tmp, save, metrics, marker, iters=STEPS):
    return ["--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL, "--global-batch-size", "4",
            "--micro-batch-size", "2", "--train-iters", str(iters), "--lr", "3e-3", "--log-interval", "1",
            "--eval-iters", "0", "--threads", "1", "--seed", "7", "--metrics", metrics, "--data-cache", marker,
            "--comm-timeout", "60", *save]


def launch(tmp, tag, save_flags, launch_flags=(), extra=(), iters=STEPS):
    """`loom launch` on 2 ranks, started; (process, metrics, marker)."""
    metrics, marker = os.path.join(tmp, tag + ".jsonl"), os.path.join(tmp, tag + "-marker")
    cmd = [LOOM, "launch", "--nproc-per-node", "2", *launch_flags, "--", "train",
           *train_args(tmp, save_flags, metrics, marker, iters), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV), metrics, marker


def losses(metrics):
    """{step: loss} of a --metrics file (a step logged twice: the later row)."""
    return {r["step"]: r["loss"] for r in lib.metrics_rows(metrics)}


def wait_steps(p, metrics, k, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None and len(lib.metrics_rows(metrics)) < k:
        time.sleep(0.05)
    return len(lib.metrics_rows(metrics)) >= k


def job_processes(marker):
    """pids of the loom and mpirun processes whose command line holds marker."""
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            cmdline = open(d + "/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmdline and os.path.basename(cmdline[0]) in (b"loom", b"mpirun", b"orterun") and \
                marker.encode() in b" ".join(cmdline):
            out.append(int(d[6:]))
    return out


def leftovers(marker):
    """The job's processes still there a moment after the launcher exited
    (killed, so that a failing check leaves nothing running)."""
    time.sleep(0.5)
    pids = job_processes(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def lock_free(save):
    """Whether the save directory's lock can be taken (no job holds it)."""
    try:
        fd = os.open(os.path.join(save, ".lock"), os.O_RDWR)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def signal_case(tmp, tag, sig, full, launch_flags=(), resume=True):
    save = os.path.join(tmp, tag)
    p, metrics, marker = launch(tmp, tag, ["--save", save], launch_flags)
    if not check(f"{tag}: running", wait_steps(p, metrics, 5), p.stderr.read() if p.poll() is not None else ""):
        p.kill()
        leftovers(marker)
        return
    p.send_signal(sig)
    out, err, took = lib.finish(p, 60)
    left = leftovers(marker)
    name = signal.Signals(sig).name
    check(f"{tag}: {name} to the launcher: exit {p.returncode} == 0 in {took:.1f} s (<= 15 s)",
          p.returncode == 0 and took <= 15, err[-800:])
    check(f"{tag}: no process of the job left", not left, str(left))
    step = len(lib.metrics_rows(metrics))
    check(f"{tag}: stopped early (step {step} of {STEPS}) with a checkpoint at that step",
          0 < step < STEPS and os.path.isdir(os.path.join(save, f"iter_{step:07d}")),
          str(os.listdir(save)) if os.path.isdir(save) else "no " + save)
    check(f"{tag}: the save directory's lock is free", lock_free(save))
    check(f"{tag}: no restart after the signal", "loom launch: restart" not in err and out.count("ranks: 2") == 1,
          err[-800:])
    if not resume:
        return
    # the same command again: it resumes from --save and ends as the uninterrupted run
    p, metrics2, marker = launch(tmp, tag, ["--save", save], launch_flags)
    out, err, _ = lib.finish(p, 120)
    leftovers(marker)
    got = losses(metrics)  # the same --metrics file: the resumed steps' rows follow
    ok = p.returncode == 0 and f"resumed at step {step + 1} " in out
    check(f"{tag}: the same command launched again resumes at step {step + 1}", ok, (out + err)[-800:])
    same = [s for s in range(step + 1, STEPS + 1) if got.get(s) == full.get(s)]
    check(f"{tag}: its steps {step + 1}..{STEPS} have the uninterrupted run's losses bit for bit "
          f"({len(same)} of {STEPS - step} equal)", ok and len(same) == STEPS - step)


def orphan_cases(tmp):
    save = os.path.join(tmp, "killed")
    p, metrics, marker = launch(tmp, "killed", ["--save", save])
    if check("launcher SIGKILLed: running", wait_steps(p, metrics, 5)):
        p.kill()
        p.communicate()
        deadline = time.time() + 15
        while time.time() < deadline and job_processes(marker):
            time.sleep(0.1)
        left = leftovers(marker)
        step = len(lib.metrics_rows(metrics))
        check(f"launcher SIGKILLed: the job stopped (step {step} of {STEPS}) with its checkpoint, nothing left",
              not left and 0 < step < STEPS and os.path.isdir(os.path.join(save, f"iter_{step:07d}")) and
              lock_free(save), str(left))

    save, metrics, marker = (os.path.join(tmp, "usr2" + x) for x in ("", ".jsonl", "-marker"))
    p = subprocess.Popen(lib.mpirun(2, [LOOM, "train"] + train_args(tmp, ["--save", save], metrics, marker)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    if check("SIGUSR2 to mpirun: running", wait_steps(p, metrics, 5)):
        p.send_signal(signal.SIGUSR2)
        out, err, _ = lib.finish(p, 60)
        step = len(lib.metrics_rows(metrics))
        check(f"SIGUSR2 to mpirun: every rank stops after step {step}, saves, exit {p.returncode}",
              p.returncode == 0 and f"stopped after step {step} of {STEPS}: SIGUSR2" in out and
              os.path.isdir(os.path.join(save, f"iter_{step:07d}")), (out + err)[-600:])
    leftovers(marker)


def restart_cases(tmp):
    """A restart resumes from --save (given as --save=DIR) and not from the
    --load X among the train arguments; a JSON "save" counts as --save."""
    start = os.path.join(tmp, "start")  # X: a 3-step checkpoint
    lib.run_ranks(1, [LOOM, "train"] + train_args(tmp, ["--save", start], os.path.join(tmp, "start.jsonl"),
                                                  os.path.join(tmp, "start-m"), iters=3))
    save = os.path.join(tmp, "from-load")
    p, metrics, marker = launch(tmp, "from-load", ["--save=" + save, "--save-interval", "20", "--load", start],
                                ["--max-restarts", "1"])
    if wait_steps(p, metrics, 50):
        for pid, rank in lib.loom_ranks(marker).items():
            if rank == 1:
                os.kill(pid, signal.SIGKILL)
    out, err, _ = lib.finish(p, 120)
    leftovers(marker)
    resumed = [l for l in out.splitlines() if l.startswith("resumed at step")]
    check(f"--load X --save=DIR: the restart resumes from --save, not X, exit {p.returncode}",
          p.returncode == 0 and "restart 1 of 1" in err and len(resumed) == 2 and "at step 4 " in resumed[0] and
          save in resumed[1] and "at step 4 " not in resumed[1], (str(resumed) + err[-600:]))

    # a DeepSpeed JSON's "save": --max-restarts accepts it, a relaunch resumes from it
    ds = os.path.join(tmp, "ds.json")
    save = os.path.join(tmp, "json-save")
    with open(ds, "w") as f:
        json.dump({"save": save}, f)
    lib.run_ranks(1, [LOOM, "train"] + train_args(tmp, ["--save", save], os.path.join(tmp, "js.jsonl"),
                                                  os.path.join(tmp, "js-m"), iters=3))
    p, metrics, marker = launch(tmp, "json", ["--deepspeed-config", ds], ["--max-restarts", "1"], iters=5)
    out, err, _ = lib.finish(p, 120)
    leftovers(marker)
    check(f"a DeepSpeed JSON's \"save\" is --save: --max-restarts takes it and the job resumes from it, "
          f"exit {p.returncode}", p.returncode == 0 and "resumed at step 4 " in out, (out + err)[-600:])


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        ref = os.path.join(tmp, "full")
        p, metrics, marker = launch(tmp, "full", ["--save", ref])
        out, err, _ = lib.finish(p, 300)
        leftovers(marker)
        if not check("the uninterrupted run, exit 0", p.returncode == 0, err[-800:]):
            return lib.verdict()
        full = losses(metrics)
        signal_case(tmp, "sigterm", signal.SIGTERM, full)
        signal_case(tmp, "sigint", signal.SIGINT, full, resume=False)
        signal_case(tmp, "restarts", signal.SIGTERM, full, ["--max-restarts", "2"])
        orphan_cases(tmp)
        restart_cases(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
