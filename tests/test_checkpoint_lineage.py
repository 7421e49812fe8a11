"""Checkpoint lineage: which run a checkpoint belongs to, and what travels
with it.

- A damaged newest checkpoint falls back to the newest intact one of the
  same run (the run latest names), not to another run's that happens to
  hold a later iteration; when every checkpoint of that run is damaged and
  the fallback crosses to another run's, one warning names both runs.
- A checkpoint's tokenizer.json is recorded in its trainer state (size and
  XXH3): `loom sample` and `loom convert` refuse one that was substituted,
  or one put into a checkpoint saved without a tokenizer, with one line,
  exit 2 (convert writes nothing).
- The save directory's lock is checked at each save: a job whose
  SAVE/.lock was removed and taken by another job refuses to save (one
  line, exit 1) and the other job's checkpoint stays as it was.
- A save directory a save would fail on (a regular file named
  iter_NNNNNNN, a `latest` that is a directory) is refused at start-up,
  before training: one line, exit 2.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import lib
from lib import LOOM, check

VOCAB = "300"  # room for a small byte-level BPE tokenizer's ids


def train_args(tmp, save, iters, extra=()):
    model = [a if a != "256" else VOCAB for a in lib.TINY_MODEL]
    return ["train", "--data-path", os.path.join(tmp, "train.bin"), *model, "--train-iters", str(iters),
            "--eval-iters", "0", "--threads", "1", "--log-interval", "1", "--save", save, *extra]


def run_of(d):
    with open(os.path.join(d, "trainer_state.json")) as f:
        return json.load(f).get("run")


def damage(d):
    """Flips the last byte of the rank file (tensor data): it fails its checksum."""
    path = os.path.join(d, "rank_00000.safetensors")
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))


def same_run_fallback(tmp):
    save = os.path.join(tmp, "runs")
    a = lib.loom(*train_args(tmp, save, 10))
    b = lib.loom(*train_args(tmp, save, 4, ["--save-interval", "2"]))
    if not check("run A leaves iter_0000010, run B iter_0000002 and iter_0000004",
                 a.returncode == 0 and b.returncode == 0 and
                 all(os.path.isdir(os.path.join(save, f"iter_{i:07d}")) for i in (2, 4, 10)),
                 (a.stderr + b.stderr)[-400:]):
        return
    run_a, run_b = run_of(os.path.join(save, "iter_0000010")), run_of(os.path.join(save, "iter_0000004"))
    damage(os.path.join(save, "iter_0000004"))
    p = lib.loom(*train_args(tmp, os.path.join(tmp, "out1"), 6, ["--load", save]))
    falls = [l for l in p.stderr.splitlines() if "falling back to" in l]
    check("B's newest damaged: falls back to B's iter_0000002 (not A's later iter_0000010), without a "
          "crossing warning",
          p.returncode == 0 and len(falls) == 1 and falls[0].endswith("iter_0000002") and
          "resumed at step 3" in p.stdout and "another run's" not in p.stderr, p.stdout[-300:] + p.stderr[-400:])
    damage(os.path.join(save, "iter_0000002"))
    p = lib.loom(*train_args(tmp, os.path.join(tmp, "out2"), 12, ["--load", save]))
    cross = [l for l in p.stderr.splitlines() if "another run's" in l]
    check("every checkpoint of B damaged: resumes A's iter_0000010, one warning naming both runs",
          p.returncode == 0 and "resumed at step 11" in p.stdout and len(cross) == 1 and run_a in cross[0] and
          run_b in cross[0], p.stdout[-300:] + p.stderr[-400:])


def tokenizer_record(tmp):
    toks = {}
    for n in ("270", "280"):
        out = os.path.join(tmp, "tok" + n)
        p = lib.loom("data", "train-tokenizer", "--vocab-size", n, os.path.join(tmp, "corpus.txt"), out)
        if not check(f"train-tokenizer --vocab-size {n}", p.returncode == 0, p.stderr[-300:]):
            return
        toks[n] = os.path.join(out, "tokenizer.json")
    save = os.path.join(tmp, "tok-save")
    p = lib.loom(*train_args(tmp, save, 2, ["--tokenizer", toks["270"]]))
    d = os.path.join(save, "iter_0000002")
    with open(os.path.join(d, "trainer_state.json")) as f:
        rec = json.load(f).get("tokenizer") if p.returncode == 0 else None
    check("the trainer state records the saved tokenizer.json with its size and checksum",
          isinstance(rec, dict) and rec.get("name") == "tokenizer.json" and
          rec.get("bytes") == os.path.getsize(os.path.join(d, "tokenizer.json")) and len(rec.get("xxh3", "")) == 16,
          p.stderr[-300:] + str(rec))
    sample = ["sample", "--load", save, "--prompt", "ab", "--max-new-tokens", "2", "--seed", "1"]
    p = lib.loom(*sample)
    check("loom sample with the saved tokenizer: exit 0", p.returncode == 0, p.stderr[-300:])
    shutil.copy(toks["280"], os.path.join(d, "tokenizer.json"))
    p = lib.loom(*sample)
    errs = lib.error_lines(p.stderr)
    check("a substituted tokenizer.json: loom sample exit 2, one line naming it", p.returncode == 2 and
          len(errs) == 1 and "tokenizer.json" in errs[0] and "not the tokenizer saved" in errs[0], p.stderr[-300:])
    out = os.path.join(tmp, "tok-hf")
    os.makedirs(out)
    p = lib.loom("convert", save, out, "--to", "hf")
    errs = lib.error_lines(p.stderr)
    check("a substituted tokenizer.json: loom convert exit 2, one line, nothing written", p.returncode == 2 and
          len(errs) == 1 and "not the tokenizer saved" in errs[0] and os.listdir(out) == [], p.stderr[-300:])
    bare = os.path.join(tmp, "bare-save")
    p = lib.loom(*train_args(tmp, bare, 2))
    shutil.copy(toks["270"], os.path.join(bare, "iter_0000002", "tokenizer.json"))
    p = lib.loom("sample", "--load", bare, "--prompt", "ab", "--max-new-tokens", "2")
    errs = lib.error_lines(p.stderr)
    check("a tokenizer.json put into a checkpoint saved without one: exit 2, one line", p.returncode == 2 and
          len(errs) == 1 and "saved without a tokenizer" in errs[0], p.stderr[-300:])


def lock_replaced(tmp):
    save = os.path.join(tmp, "locked")
    first = subprocess.Popen([LOOM, *train_args(tmp, save, 2500)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    lock = os.path.join(save, ".lock")
    deadline = time.time() + 30
    while time.time() < deadline and not os.path.exists(lock):
        time.sleep(0.02)
    os.remove(lock)
    second = lib.loom(*train_args(tmp, save, 3))
    state = os.path.join(save, "iter_0000003", "trainer_state.json")
    before = open(state, "rb").read() if os.path.exists(state) else b""
    out, err = first.communicate(timeout=300)
    errs = lib.error_lines(err)
    check("a second job takes the removed lock's place and saves iter_0000003", second.returncode == 0 and before,
          second.stderr[-300:])
    check("the first job, its lock gone: refuses to save, exit 1, one line naming the lock",
          first.returncode == 1 and len(errs) == 1 and ".lock" in errs[0], err[-400:])
    check("the second job's checkpoint and latest are untouched, nothing of the first written",
          open(os.path.join(save, "latest")).read().strip() == "iter_0000003" and
          open(state, "rb").read() == before and
          sorted(x for x in os.listdir(save) if "iter_" in x) == ["iter_0000003"], str(os.listdir(save)))


def startup_checks(tmp):
    def case(name, make, want):
        save = os.path.join(tmp, "bad-" + name.replace(" ", "-"))
        os.makedirs(save)
        make(save)
        t0 = time.time()
        p = lib.loom(*train_args(tmp, save, 5))
        errs = lib.error_lines(p.stderr)
        check(f"{name}: exit 2 at start-up, one line naming it, before any step",
              p.returncode == 2 and len(errs) == 1 and want in errs[0] and "step" not in p.stdout,
              p.stdout[-200:] + p.stderr[-300:])

    case("a regular file named iter_0000005", lambda s: open(os.path.join(s, "iter_0000005"), "w").close(),
         "iter_0000005 is not a directory")
    case("latest a directory", lambda s: os.makedirs(os.path.join(s, "latest")), "latest is a directory")


def main():
    if not lib.built(LOOM):
        return lib.verdict()
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        with open(os.path.join(tmp, "corpus.txt"), "w") as f:
            f.write("the quick brown fox jumps over the lazy dog; ab=ba, abc=cba. " * 200)
        startup_checks(tmp)
        tokenizer_record(tmp)
        same_run_fallback(tmp)
        lock_replaced(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
