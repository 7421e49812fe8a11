"""Save directories and inputs that other jobs, links and odd files touch.

- One writer per save directory: a second job on the same --save is refused
  with one line naming the holder (pid and host), exit 2, and the first
  finishes untouched.
- A save directory holding a checkpoint past the run's start (another
  run's) is said once; latest and --keep-last follow this run's checkpoints
  and leave the newer one alone.
- A save of an iteration whose checkpoint is another run's (a fresh run,
  --finetune, or a resume from an earlier point of a run: a branch) takes
  the name and moves the old one aside as iter_N.run-ID, said once; the
  old one still loads and resumes.
- Every file of a checkpoint is tied to its trainer state (the run's
  identifier and the iteration in each rank file, each file's size, the
  directory's name): a file of another run or iteration, another size, or a
  directory named for another iteration falls back to the previous
  checkpoint, named.
- --keep-last never follows an iter_* link out of the save directory: the
  archived checkpoint it points to keeps every file.
- A FIFO in place of `latest`, a trainer state, a rank file or a data shard
  is refused (or skipped, for `latest`) at once, never waited on.
- A metrics file that cannot be written (a full disk) stops the run with
  exit 1 and one line naming it.
- A JSON config that gives a key twice is refused, naming the key.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import lib
from lib import ENV, LOOM, check
from pyref import ckpt


def train_args(tmp, save, iters, extra=()):
    return ["train", "--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL, "--train-iters", str(iters),
            "--eval-iters", "0", "--threads", "1", "--log-interval", "1", "--save", save, *extra]


def one_writer(tmp):
    save = os.path.join(tmp, "shared")
    first = subprocess.Popen([LOOM] + train_args(tmp, save, 3000), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.time() + 30
    while time.time() < deadline and not os.path.exists(os.path.join(save, ".lock")):
        time.sleep(0.05)
    time.sleep(0.3)
    p = lib.loom(*train_args(tmp, save, 10))
    errs = lib.error_lines(p.stderr)
    check("a second job on the same --save: exit 2, one line naming the holder's pid",
          p.returncode == 2 and len(errs) == 1 and f"pid {first.pid} on " in errs[0] and save in errs[0],
          p.stderr[-400:])
    out, err = first.communicate(timeout=300)
    check("the first job finishes and its last checkpoint is there", first.returncode == 0 and
          os.path.exists(os.path.join(save, "iter_0003000", "trainer_state.json")), err[-400:])
    p = lib.loom(*train_args(tmp, save, 3001, ["--load", save]))
    check("once it is done, the directory takes a new job (resume)", p.returncode == 0, p.stderr[-400:])


def newer_checkpoints(tmp):
    """Another run's newer checkpoint in --save: said once; this run's saves
    replace the same iterations, latest names them, --keep-last leaves the
    newer one alone (before, it kept the stale one and deleted the new)."""
    save = os.path.join(tmp, "newer")
    p = lib.loom(*train_args(tmp, save, 10))
    check("a run leaves iter_0000010", p.returncode == 0 and os.path.exists(os.path.join(save, "iter_0000010")))
    p = lib.loom(*train_args(tmp, save, 5, ["--save-interval", "1", "--keep-last", "2"]))
    warns = [l for l in p.stderr.splitlines() if "holds iter_0000010, past this run's start" in l]
    kept = sorted(x for x in os.listdir(save) if x.startswith("iter_"))
    check("a fresh run into it: one warning naming the newer checkpoint, exit 0", p.returncode == 0 and
          len(warns) == 1, p.stderr[-300:])
    check("latest names this run's last checkpoint; --keep-last 2 kept this run's newest two and the other run's",
          open(os.path.join(save, "latest")).read().strip() == "iter_0000005" and
          kept == ["iter_0000004", "iter_0000005", "iter_0000010"], str(kept))
    p = lib.loom(*train_args(tmp, save, 7, ["--load", save]))
    check("--load of the same directory continues this run from latest (step 5), without the warning",
          p.returncode == 0 and "iter_0000005" in p.stdout and "resumed at step 6" in p.stdout and
          "past this run's start" not in p.stderr,
          p.stderr[-300:])


def run_of(d):
    import json
    return json.load(open(os.path.join(d, "trainer_state.json"))).get("run")


def replaced_iterations(tmp):
    """Saves that meet another run's checkpoint of the same iteration."""
    save = os.path.join(tmp, "replaced")
    it5 = os.path.join(save, "iter_0000005")
    p = lib.loom(*train_args(tmp, save, 10, ["--save-interval", "5"]))
    first = run_of(it5) if p.returncode == 0 else None
    p = lib.loom(*train_args(tmp, save, 5, ["--save-interval", "5"]))
    aside = os.path.join(save, f"iter_0000005.run-{first}")
    warns = [l for l in p.stderr.splitlines() if "kept as" in l and aside in l]
    check("a fresh run saving iter_5 over another run's: its own takes the name, the old one is kept aside "
          "as iter_0000005.run-ID, said once",
          p.returncode == 0 and os.path.isdir(aside) and run_of(aside) == first and run_of(it5) != first and
          len(warns) == 1, p.stderr[-400:])
    metrics = os.path.join(tmp, "aside.jsonl")
    p = lib.loom(*train_args(tmp, os.path.join(tmp, "aside-resumed"), 7, ["--load", aside, "--metrics", metrics]))
    check("the checkpoint kept aside still loads and resumes (at step 6)",
          p.returncode == 0 and "resumed at step 6" in p.stdout and lib.metrics_rows(metrics)[0]["step"] == 6,
          p.stderr[-300:])
    # a rewind of one run: --load of its iter_5 while its iter_10 exists
    rewind = os.path.join(tmp, "rewind")
    p = lib.loom(*train_args(tmp, rewind, 10, ["--save-interval", "5"]))
    run = run_of(os.path.join(rewind, "iter_0000010"))
    p = lib.loom(*train_args(tmp, rewind, 10, ["--save-interval", "5", "--load",
                                               os.path.join(rewind, "iter_0000005"), "--lr", "0.002"]))
    aside = os.path.join(rewind, f"iter_0000010.run-{run}")
    check("a resume from iter_5 while iter_10 exists (a branch, another --lr): the old iter_10 is kept aside, "
          "the branch's takes the name under a run of its own",
          p.returncode == 0 and os.path.isdir(aside) and run_of(aside) == run and
          run_of(os.path.join(rewind, "iter_0000010")) != run and "before iter_0000010" in p.stderr,
          p.stderr[-400:])
    # --finetune into the directory it loads: a new run from step 0
    p = lib.loom(*train_args(tmp, rewind, 5, ["--save-interval", "5", "--load", rewind, "--finetune"]))
    asides = [x for x in os.listdir(rewind) if x.startswith("iter_0000005.run-")]
    check("--finetune saving iter_5 into the directory it loads: the old iter_5 is kept aside",
          p.returncode == 0 and len(asides) == 1, p.stderr[-400:] + str(os.listdir(rewind)))


def tied_files(tmp):
    """Every file of a checkpoint is tied to its state: a rank file of another
    run or iteration, a size that differs, a directory named for another
    iteration, each falls back to the previous checkpoint, named."""
    a, b = os.path.join(tmp, "tie-a"), os.path.join(tmp, "tie-b")
    lib.loom(*train_args(tmp, a, 4, ["--save-interval", "2"]))
    lib.loom(*train_args(tmp, b, 4, ["--save-interval", "2", "--seed", "5"]))
    rank0 = "rank_00000.safetensors"
    # what a resume from the intact iter_0000002 ends with, at step 5
    ref = os.path.join(tmp, "tie-reference")
    lib.loom(*train_args(tmp, ref, 5, ["--load", os.path.join(a, "iter_0000002")]))
    want_state = ckpt.assemble(ref)

    def case(name, damage, want):
        d, out = os.path.join(tmp, "tie-" + name), os.path.join(tmp, "tie-out-" + name)
        shutil.copytree(a, d)
        damage(d)
        p = lib.loom(*train_args(tmp, out, 5, ["--load", d]))
        warns = [l for l in p.stderr.splitlines() if "falling back to" in l]
        got = ckpt.assemble(out) if p.returncode == 0 else {}
        check(f"{name}: falls back to iter_0000002, naming why, and resumes from it exactly (at step 5 the "
              "state of a resume from the intact iter_0000002, bit for bit)",
              p.returncode == 0 and len(warns) == 1 and want in warns[0] and "resumed at step 3" in p.stdout and
              got.keys() == want_state.keys() and all(lib.same_bits(got[k], want_state[k]) for k in got),
              p.stderr[-400:])

    case("a rank file of another run",
         lambda d: shutil.copy(os.path.join(b, "iter_0000004", rank0), os.path.join(d, "iter_0000004", rank0)),
         "a file of run")
    case("a rank file of another iteration",
         lambda d: shutil.copy(os.path.join(d, "iter_0000002", rank0), os.path.join(d, "iter_0000004", rank0)),
         "iteration 2, in a checkpoint of run")

    def grow(d):
        with open(os.path.join(d, "iter_0000004", rank0), "ab") as f:
            f.write(b" ")
    case("a rank file of another size", grow, "the trainer state records")

    def rename(d):
        os.rename(os.path.join(d, "iter_0000004"), os.path.join(d, "iter_0000003"))
        with open(os.path.join(d, "latest"), "w") as f:
            f.write("iter_0000003\n")
    case("a directory named for another iteration", rename, "its trainer state is of iteration 4, not 3")

    # two names of one file (a hard link): refused as the state lists them, or for its size
    two = os.path.join(tmp, "tie-two")
    lib.run_ranks(2, [LOOM] + train_args(tmp, two, 4, ["--save-interval", "2", "--zero-stage", "1"]), tag="two")
    it = os.path.join(two, "iter_0000004")
    os.remove(os.path.join(it, "rank_00001.safetensors"))
    os.link(os.path.join(it, rank0), os.path.join(it, "rank_00001.safetensors"))
    p = lib.run_ranks(2, [LOOM] + train_args(tmp, os.path.join(tmp, "tie-out-two"), 5, ["--load", two]),
                      expect=None, tag="two resumed")
    warns = [l for l in p.stderr.splitlines() if "falling back to" in l]
    check("two names of one rank file: falls back to iter_0000002, naming why",
          p.returncode == 0 and len(warns) == 1 and ("are one file" in warns[0] or "records" in warns[0] or
                                                     "a file of run" in warns[0]), p.stderr[-400:])


def keep_last_links(tmp):
    archive = os.path.join(tmp, "archive")
    p = lib.loom(*train_args(tmp, archive, 2))
    check("an archived checkpoint outside the save directory", p.returncode == 0)
    save = os.path.join(tmp, "linked")
    os.makedirs(save)
    os.symlink(os.path.join(archive, "iter_0000002"), os.path.join(save, "iter_0000000"))
    p = lib.loom(*train_args(tmp, save, 6, ["--save-interval", "1", "--keep-last", "2"]))
    state = os.path.join(archive, "iter_0000002", "trainer_state.json")
    kept = sorted(os.path.basename(d) for d in glob.glob(os.path.join(save, "iter_*")))
    check("--keep-last 2 with an iter_ link: the linked checkpoint keeps its state file",
          p.returncode == 0 and os.path.exists(state), p.stderr[-300:])
    check("--keep-last 2 kept the newest two of its own, and left the link alone",
          kept == ["iter_0000000", "iter_0000005", "iter_0000006"] and os.path.islink(
              os.path.join(save, "iter_0000000")), str(kept))


def fifos(tmp):
    src = os.path.join(tmp, "fifo-src")
    lib.loom(*train_args(tmp, src, 2))

    def copy(name):
        d = os.path.join(tmp, name)
        shutil.copytree(src, d)
        return d

    # latest: skipped, the checkpoint directory itself is used
    d = copy("fifo-latest")
    os.remove(os.path.join(d, "latest"))
    os.mkfifo(os.path.join(d, "latest"))
    t0 = time.time()
    p = lib.run([LOOM] + train_args(tmp, os.path.join(tmp, "out1"), 4, ["--load", d]), timeout=60)
    check(f"a FIFO as latest: not waited on, the newest checkpoint resumes ({time.time() - t0:.1f} s)",
          p.returncode == 0 and "resumed at step 3" in p.stdout, p.stderr[-300:])
    for name, what in (("trainer_state.json", "trainer state"), ("rank", "rank file")):
        d = copy("fifo-" + name.split(".")[0])
        it = os.path.join(d, "iter_0000002")
        target = os.path.join(it, name) if name != "rank" else sorted(glob.glob(os.path.join(it, "*.safetensors")))[0]
        os.remove(target)
        os.mkfifo(target)
        t0 = time.time()
        p = lib.run([LOOM] + train_args(tmp, os.path.join(tmp, "out-" + name), 4, ["--load", d]), timeout=60)
        errs = lib.error_lines(p.stderr)
        check(f"a FIFO as the {what}: refused at once with one line ({time.time() - t0:.1f} s, exit {p.returncode})",
              p.returncode == 2 and len(errs) == 1 and time.time() - t0 < 30, p.stderr[-300:])
    fifo = os.path.join(tmp, "data.fifo")
    os.mkfifo(fifo)
    p = lib.run([LOOM, "train", "--data-path", fifo, "--train-iters", "2"], timeout=60)
    errs = lib.error_lines(p.stderr)
    check("a FIFO as a data shard: exit 2, 'not a regular file'",
          p.returncode == 2 and len(errs) == 1 and "not a regular file" in errs[0], p.stderr[-300:])


def metrics_full(tmp):
    p = lib.run([LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL, "--train-iters",
                 "20", "--eval-iters", "0", "--metrics", "/dev/full"], timeout=120)
    errs = lib.error_lines(p.stderr)
    check("metrics on a full disk (/dev/full): exit 1, one line naming the file and the cause",
          p.returncode == 1 and len(errs) == 1 and "--metrics /dev/full" in errs[0] and "No space" in errs[0],
          p.stderr[-300:])


def json_duplicates(tmp):
    path = os.path.join(tmp, "dup.json")
    with open(path, "w") as f:
        f.write('{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", '
                '"params": {"lr": 1e-3, "lr": 2e-3}}}')
    p = lib.loom("train", "--deepspeed-config", path, "--dry-run")
    errs = lib.error_lines(p.stderr)
    check("a JSON key given twice: exit 2 naming it", p.returncode == 2 and len(errs) == 1 and
          '"optimizer.params.lr" is given twice' in errs[0], p.stderr[-300:])


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        one_writer(tmp)
        newer_checkpoints(tmp)
        replaced_iterations(tmp)
        tied_files(tmp)
        keep_last_links(tmp)
        fifos(tmp)
        metrics_full(tmp)
        json_duplicates(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
