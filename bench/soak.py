"""Soak: training on 3 "hosts" (network namespaces, as tests/test_multihost.py
makes them) under `loom launch --max-restarts`, with a random fault every
--every A:B minutes for --minutes in all: a rank killed (kill -9), a link
cut for 20 s (veth down), SIGTERM to every rank (the graceful stop: the
driver starts the job again, as a scheduler requeues it), a rank stalled
(SIGSTOP: the communication deadline's hang report, then a restart), and
the faults around the job: SIGTERM to `loom launch` itself (the job stops
and saves, the launcher exits 0; the driver launches the same command
again, which resumes from --save), a full disk under --metrics and
--tensorboard-dir (a small tmpfs filled up for 20 s: the job saves and exits
1, the launcher restarts it until there is room again), and the save
directory's lock deleted (the next save is refused, exit 1, and the restart
takes a lock of its own). The run must reach its last step; every step's
loss it logged (steps redone after a restart included) must be the
uninterrupted run's at that step, its final weights and Adam moments that
run's bit for bit (run first, same hosts), and every checkpoint left in the
save directory must load (`loom convert`). Prints each fault: when it was
made, how long until the job noticed (the launcher's restart line or the
job's end) and until training resumed (the next step logged).

    make && /usr/bin/python3 bench/soak.py [--minutes 30] [--every 2:5] [--steps N] [--kinds K,...] [--log FILE]

Root and iproute2 needed (and tmpfs mounts); everything made is removed at
the end.
"""
import argparse
import functools
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import lib  # noqa: E402
import test_multihost as mh  # noqa: E402
from pyref import ckpt  # noqa: E402

print = functools.partial(print, flush=True)  # noqa: A001 (each line as it happens)


def train_args(tmp, save, metrics, steps):
    tb = os.path.join(os.path.dirname(metrics), os.path.basename(save) + "-tb")
    return ["train", "--data-path", os.path.join(tmp, "train.bin"), "--model", "gpt2-tiny", "--micro-batch-size", "4",
            "--global-batch-size", "12", "--train-iters", str(steps), "--eval-iters", "0", "--threads", "1",
            "--log-interval", "1", "--seed", "7", "--metrics", metrics, "--tensorboard-dir", tb, "--save", save,
            "--save-interval", "20", "--comm-timeout", "10"]


def metrics_rows(path):
    """The step rows of a --metrics file, a cut last line (a full disk) skipped."""
    rows = []
    if os.path.exists(path):
        for line in open(path):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "loss" in r:
                rows.append(r)
    return rows


class Job:
    """loom launch in the launcher namespace; its stderr lines, time-stamped."""

    def __init__(self, tmp, env, save, metrics, steps, resume):
        args = train_args(tmp, save, metrics, steps) + (["--load", save] if resume else [])
        cmd = ["ip", "netns", "exec", mh.LAUNCHER, lib.LOOM, "launch", "--nproc-per-node", "1", "--hostfile",
               mh.hostfile(tmp), "--max-restarts", "1000", "--"] + args
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines = []
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.p.stderr:
            self.lines.append((time.time(), line.rstrip("\n")))


def loom_pids(host):
    out = []
    for pid in mh.sh("ip", "netns", "pids", host, check_rc=False).stdout.split():
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "loom":
                out.append(int(pid))
        except OSError:
            pass
    return out


KINDS = ["kill", "cut", "sigterm", "stall", "launcher", "diskfull", "lock"]


def fill(logs, seconds):
    """Fills the logs' tmpfs to the last byte, and empties it again after seconds."""
    filler = os.path.join(logs, "filler")
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass
    threading.Timer(seconds, lambda: os.path.exists(filler) and os.remove(filler)).start()


def fault(kind, rng, job, logs, save):
    host = rng.choice(mh.HOSTS)
    pids = loom_pids(host)
    if kind == "launcher":  # a preemption as a scheduler sends it: to the launcher
        job.p.send_signal(signal.SIGTERM)
        return "launcher"
    if kind == "diskfull":
        fill(logs, 20)
        return "logs"
    if kind == "lock":
        try:
            os.remove(os.path.join(save, ".lock"))
        except OSError:
            pass
        return "save"
    if kind == "kill":
        for pid in pids[:1]:
            os.kill(pid, signal.SIGKILL)
    elif kind == "stall":
        for pid in pids[:1]:
            os.kill(pid, signal.SIGSTOP)
    elif kind == "sigterm":
        for h in mh.HOSTS:
            for pid in loom_pids(h):
                os.kill(pid, signal.SIGTERM)
    elif kind == "cut":
        i = mh.HOSTS.index(host) + 1
        mh.sh("ip", "-n", host, "link", "set", f"{mh.TAG}v{i}", "down")
        threading.Timer(20, lambda: mh.sh("ip", "-n", host, "link", "set", f"{mh.TAG}v{i}", "up",
                                          check_rc=False)).start()
    return host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--every", default="2:5", help="minutes between faults, A:B")
    ap.add_argument("--steps", type=int, default=0, help="steps (default: what --minutes of clean training takes)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(KINDS), help="the faults to make, a comma-separated list")
    ap.add_argument("--log", help="write every line the jobs printed here, time-stamped")
    a = ap.parse_args()
    lo, hi = (float(x) for x in a.every.split(":"))
    want = a.kinds.split(",")
    if set(want) - set(KINDS):
        sys.exit(f"soak: --kinds: unknown {sorted(set(want) - set(KINDS))} (known: {','.join(KINDS)})")
    rng = random.Random(a.seed)
    if os.geteuid() != 0:
        sys.exit("soak: needs root for network namespaces")
    mh.teardown()
    mh.setup()
    logs = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            lib.write_corpus(tmp)
            logs = os.path.join(tmp, "logs")  # --metrics and --tensorboard-dir: a disk that can fill
            os.makedirs(logs)
            mh.sh("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", logs)
            env = mh.mpi_env(tmp)
            steps = a.steps
            if not steps:  # measure a step
                probe = os.path.join(logs, "probe.jsonl")
                j = Job(tmp, env, os.path.join(tmp, "probe"), probe, 60, False)
                j.p.wait()
                rows = metrics_rows(probe)
                ms = sorted(r["ms_per_step"] for r in rows[5:])[len(rows[5:]) // 2]
                steps = int(a.minutes * 60 * 1000 / (ms * 1.3))
            print(f"soak: {steps} steps on 3 hosts, a fault every {lo}-{hi} min for {a.minutes} min")
            ref = os.path.join(tmp, "ref")
            t0 = time.time()
            j = Job(tmp, env, ref, os.path.join(logs, "ref.jsonl"), steps, False)
            j.p.wait()
            print(f"uninterrupted run: exit {j.p.returncode} in {time.time() - t0:.0f} s")
            ref_losses = {r["step"]: r["loss"] for r in metrics_rows(os.path.join(logs, "ref.jsonl"))}
            save, metrics = os.path.join(tmp, "soak"), os.path.join(logs, "soak.jsonl")
            faults, job, resume, progress, kinds, jobs = [], None, False, [], [], []
            start = time.time()
            next_fault = start + rng.uniform(lo, hi) * 60
            while True:
                if job is None:
                    job = Job(tmp, env, save, metrics, steps, resume)
                    jobs.append(job)
                    resume = True
                progress.append((time.time(), len(metrics_rows(metrics))))
                if job.p.poll() is not None:
                    job.ended = time.time()
                    rows = metrics_rows(metrics)
                    if job.p.returncode == 0 and rows and rows[-1]["step"] == steps:
                        break
                    if job.p.returncode != 0:
                        print(f"soak: the job failed for good (exit {job.p.returncode}):")
                        print("\n".join(l for _, l in job.lines[-15:]))
                        return 1
                    for f in faults:  # a graceful stop: the SIGTERM was noticed when the job ended
                        if f["job"] is job and f["kind"] in ("sigterm", "launcher") and f.get("det") is None:
                            f["det"] = job.ended
                    job = None  # start it again, as a scheduler requeues it
                    continue
                if time.time() >= next_fault and time.time() - start < a.minutes * 60:
                    if not kinds:  # every kind once in a shuffled round, then again
                        kinds = rng.sample(want, len(want))
                    kind = kinds.pop()
                    n_rows, n_lines = len(metrics_rows(metrics)), len(job.lines)
                    t = time.time()
                    host = fault(kind, rng, job, logs, save)
                    faults.append({"kind": kind, "host": host, "t": t, "rows": n_rows, "lines": n_lines,
                                   "job": job})
                    next_fault = t + rng.uniform(lo, hi) * 60
                time.sleep(0.2)
            total = time.time() - start
            if a.log:
                with open(a.log, "w") as f:
                    for t, line in sorted((t, l) for j in jobs for t, l in j.lines):
                        f.write(f"{(t - start) / 60:8.3f} {line}\n")
            print(f"\nsoak: {steps} steps in {total / 60:.1f} min with {len(faults)} faults")
            print(f"{'at (min)':>9s} {'fault':8s} {'host':10s} {'detected after s':>17s} {'resumed after s':>16s}")
            for f in faults:
                # detected: the launcher's restart line (or, for SIGTERM, the job's end);
                # resumed: the first step logged after that
                det = f.get("det") or next((t for t, l in f["job"].lines[f["lines"]:]
                                            if l.startswith("loom launch: restart")), None)
                at_det = next((n for t, n in progress if det and t >= det), None)
                res = next((t for t, n in progress if det and t > det and at_det is not None and n > at_det), None)
                print(f"{(f['t'] - start) / 60:9.1f} {f['kind']:8s} {f['host']:10s} "
                      f"{(det - f['t']) if det else float('nan'):17.1f} "
                      f"{(res - det) if res and det else float('nan'):16.1f}")
            a_, b_ = ckpt.assemble(ref), ckpt.assemble(save)
            same = a_.keys() == b_.keys() and all(lib.same_bits(a_[k], b_[k]) for k in a_)
            print(f"final weights and moments equal the uninterrupted run's, bit for bit: {same}")
            rows = metrics_rows(metrics)
            off = [r["step"] for r in rows if ref_losses.get(r["step"]) != r["loss"]]
            print(f"every logged loss ({len(rows)} rows, steps redone after restarts included) is the "
                  f"uninterrupted run's at its step: {not off}" + (f" (differing at steps {off[:10]})" if off else ""))
            bad = []
            kept = sorted(glob.glob(os.path.join(save, "iter_*")))
            for d in kept:
                p = lib.run([lib.LOOM, "convert", d, os.path.join(tmp, "check.safetensors")], timeout=300)
                if p.returncode != 0:
                    bad.append(f"{os.path.basename(d)}: {p.stderr.strip()[-200:]}")
            print(f"every checkpoint left ({len(kept)}) loads: {not bad}" + ("".join(f"\n  {b}" for b in bad)))
            mh.sh("umount", logs, check_rc=False)
            return 0 if same and not off and not bad and kept else 1
    finally:
        if logs and os.path.ismount(logs):
            mh.sh("umount", "-l", logs, check_rc=False)
        mh.teardown()


if __name__ == "__main__":
    sys.exit(main())
