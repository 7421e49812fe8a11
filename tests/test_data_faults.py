"""Bad data during a run: a shard truncated under the run, or rewritten in
place with tokens outside the vocabulary, ends in one line naming the file
and the position, exit 1, within seconds, on one rank or two; the save
directory's newest checkpoint still resumes exactly (stopped at step 100
by --exit-interval, its weights and Adam moments equal those of a run
that never met the fault, bit for bit). A shard replaced by a new file
(rename) or made unreadable after it was opened does not disturb the run:
the run reads the file it opened. A shard bad from the start is exit 2.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import lib
from lib import ENV, LOOM, check
from pyref import ckpt

HEADER = 256 * 4  # llm.c's shard header: 256 int32


STOP = 100  # the resumed run and the reference stop here (--exit-interval)
REFERENCE = {}  # ranks -> the state at STOP of a run that met no fault


def base_args(shard, iters=3000):
    return ["train", "--data-path", shard, *lib.TINY_MODEL, "--train-iters", str(iters), "--eval-iters", "0",
            "--threads", "1", "--log-interval", "1"]


def reference(tmp, n):
    if n not in REFERENCE:
        save = os.path.join(tmp, f"reference-{n}")
        lib.run_ranks(n, [LOOM, *base_args(os.path.join(tmp, "train.bin")), "--exit-interval", str(STOP),
                          "--save", save], tag=f"reference on {n} rank(s)")
        REFERENCE[n] = ckpt.assemble(save)
    return REFERENCE[n]


def start(tmp, tag, shard, n=1, iters=3000):
    save, metrics = os.path.join(tmp, tag), os.path.join(tmp, tag + ".jsonl")
    cmd = [LOOM, *base_args(shard, iters), "--metrics", metrics, "--save", save, "--save-interval", "5"]
    p = subprocess.Popen(lib.mpirun(n, cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and len(lib.metrics_rows(metrics)) < 12:
        time.sleep(0.02)
    return p, save



def fault_case(tmp, tag, n, fault, want):
    shard = os.path.join(tmp, tag + ".bin")
    shutil.copy(os.path.join(tmp, "train.bin"), shard)
    p, save = start(tmp, tag, shard, n)
    fault(shard)
    _, err, took = lib.finish(p, 60)
    errs = [l for l in lib.error_lines(err) if "data shard" in l]
    # each rank that reads a row past the change says so before the abort
    # ends the job: one line a rank, at most
    check(f"{tag}: exit 1 within {took:.1f} s (<= 10), a line naming the file and position ({want})",
          p.returncode == 1 and took <= 10 and 1 <= len(errs) <= n and
          all(shard in e and "position" in e and want in e for e in errs), err[-600:])
    # the data repaired, the newest checkpoint resumes to STOP, as if nothing happened
    resumed = save + "-resumed"
    q = lib.run_ranks(n, [LOOM, *base_args(os.path.join(tmp, "train.bin")), "--load", save, "--exit-interval",
                          str(STOP), "--save", resumed], expect=None, timeout=120)
    a, b = reference(tmp, n), ckpt.assemble(resumed) if q.returncode == 0 else {}
    check(f"{tag}: the newest checkpoint resumes exactly: at step {STOP} the weights and moments equal an "
          "unfaulted run's, bit for bit",
          q.returncode == 0 and "resumed at step" in q.stdout and a.keys() == b.keys() and
          all(lib.same_bits(a[k], b[k]) for k in a), q.stderr[-300:] or str(lib.differing(a, b))[:300])


def truncate(shard):
    os.truncate(shard, HEADER + 200)


def rewrite(shard):
    with open(shard, "r+b") as f:  # the same file, new bytes: every token 0xFFFF
        f.seek(HEADER)
        size = os.path.getsize(shard) - HEADER
        f.write(b"\xff" * size)
        f.flush()


def harmless(tmp, tag, change):
    shard = os.path.join(tmp, tag + ".bin")
    shutil.copy(os.path.join(tmp, "train.bin"), shard)
    p, _ = start(tmp, tag, shard, iters=200)
    change(shard)
    _, err, _ = lib.finish(p, timeout=120)
    check(f"{tag}: the run reads the file it opened and finishes (exit 0)", p.returncode == 0, err[-300:])


def replace(shard):
    tmp = shard + ".new"
    with open(tmp, "wb") as f:
        f.write(b"\0" * 100)
    os.rename(tmp, shard)


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        fault_case(tmp, "truncated", 1, truncate, "past its end")
        fault_case(tmp, "rewritten", 1, rewrite, "outside the vocabulary")
        fault_case(tmp, "truncated-2-ranks", 2, truncate, "past its end")
        harmless(tmp, "replaced", replace)
        harmless(tmp, "unreadable", lambda s: os.chmod(s, 0))
        bad = os.path.join(tmp, "bad.bin")
        shutil.copy(os.path.join(tmp, "train.bin"), bad)
        rewrite(bad)
        p = lib.loom("train", "--data-path", bad, *lib.TINY_MODEL, "--train-iters", "2")
        errs = lib.error_lines(p.stderr)
        check("a shard bad from the start: exit 2 naming the token and position",
              p.returncode == 2 and len(errs) == 1 and "outside the vocabulary" in errs[0] and "position" in errs[0],
              p.stderr[-300:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
