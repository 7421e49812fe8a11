"""Every file a training run writes is checked, and a failed write stops the
run gracefully; readers skip a row cut by such a failure.

- --tensorboard-dir on a full disk: exit 1, one line naming the event file
  and the cause (it used to exit 0 with the file cut).
- --metrics filling the disk mid-run: the run saves a checkpoint at that
  step (the graceful stop's path), exits 1 with one line naming the file,
  the cause and the checkpoint; the checkpoint resumes, and the resumed run
  appending to the same file drops the cut row first.
- loom report skips a cut final line with a note, still refuses a corrupt
  line in the middle, and a page it cannot write is an error naming the
  cause that leaves no cut page behind.
- --trace on a full disk: exit 1, one line naming the file and the cause.
- loom eval --metrics on a full disk: exit 1 naming it (it used to exit 0
  with the row missing).

A full disk is a file-size limit (RLIMIT_FSIZE, as test_checkpoint's): loom
ignores SIGXFSZ, so a write past it fails with EFBIG ("File too large").
PMIX_MCA_gds=hash keeps Open MPI's start-up store in memory, out of the
limit's way.
"""
import json
import os
import resource
import sys
import tempfile

import lib
from lib import ENV, LOOM, check

ENV_LIMITED = dict(ENV, PMIX_MCA_gds="hash")


def limited(nbytes):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return set_limit


def train(tmp, extra, limit=None):
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL, "--eval-iters", "0",
           "--threads", "1", "--log-interval", "1", *extra]
    return lib.run(cmd, timeout=120, env=ENV_LIMITED, preexec_fn=limited(limit) if limit else None)


def tensorboard_full(tmp):
    d = os.path.join(tmp, "tb")
    p = train(tmp, ["--train-iters", "40", "--tensorboard-dir", d], limit=4096)
    errs = lib.error_lines(p.stderr)
    files = os.listdir(d) if os.path.isdir(d) else []
    check("--tensorboard-dir on a full disk: exit 1, one line naming the event file and the cause",
          p.returncode == 1 and len(errs) == 1 and files and "--tensorboard-dir" in errs[0]
          and files[0] in errs[0] and "too large" in errs[0].lower() and "nothing saved" in errs[0],
          f"exit {p.returncode}: {p.stderr[-400:]}")


def metrics_full(tmp):
    # the row lengths of a run like this one, to leave room for a few steps below the limit
    ref = os.path.join(tmp, "ref.jsonl")
    p = train(tmp, ["--train-iters", "2", "--metrics", ref])
    lines = open(ref).read().splitlines(True)
    config, row = len(lines[0]), len(lines[1])
    limit = 1 << 20  # above the checkpoint's largest file
    metrics, save = os.path.join(tmp, "m.jsonl"), os.path.join(tmp, "save")
    with open(metrics, "w") as f:  # an earlier run's rows, as far as the limit allows
        f.write("\n" * (limit - config - int(6.5 * row)))
    p = train(tmp, ["--train-iters", "20", "--save", save, "--save-interval", "100", "--metrics", metrics],
              limit=limit)
    errs = lib.error_lines(p.stderr)
    latest = open(os.path.join(save, "latest")).read().strip() if os.path.exists(os.path.join(save, "latest")) else None
    check("--metrics on a full disk mid-run: exit 1, one line naming the file, the cause and the checkpoint saved",
          p.returncode == 1 and len(errs) == 1 and f"--metrics {metrics}: write failed" in errs[0]
          and "too large" in errs[0].lower() and latest is not None and f"saved {latest}, stopping" in errs[0],
          f"exit {p.returncode}, latest {latest}: {p.stderr[-400:]}")
    if latest is None:
        return
    failed_at = int(latest.split("_")[1])
    rows = [json.loads(x)["step"] for x in open(metrics) if x.strip() and x.endswith("\n") and '"loss"' in x]
    check(f"the checkpoint is of the step whose row did not fit (step {failed_at}, rows to {rows[-1] if rows else None})",
          0 < failed_at < 20 and rows == list(range(1, failed_at)), str(rows))
    p = train(tmp, ["--train-iters", str(failed_at + 3), "--load", save, "--save", save, "--metrics", metrics])
    steps = [x for x in open(metrics) if x.strip() and '"loss"' in x]
    try:
        steps = [json.loads(x)["step"] for x in steps]
    except ValueError:
        steps = ["a corrupt line"]
    check("the run resumes from it, appending to the same metrics",
          p.returncode == 0 and steps[-3:] == [failed_at + 1, failed_at + 2, failed_at + 3],
          f"exit {p.returncode}: {p.stderr[-300:]} {steps[-5:]}")
    r = lib.loom("report", metrics, "-o", os.path.join(tmp, "resumed.html"))
    check("loom report reads the resumed metrics (the cut row dropped when the run appended)",
          r.returncode == 0 and "dropped" in p.stderr, r.stderr[-300:] + p.stderr[-300:])


def report_reader(tmp):
    good = os.path.join(tmp, "good.jsonl")
    train(tmp, ["--train-iters", "4", "--metrics", good])
    text = open(good).read()
    cut = os.path.join(tmp, "cut.jsonl")
    with open(cut, "w") as f:
        f.write(text[:-40])  # the last row cut mid-way, as a full disk leaves it
    p = lib.loom("report", cut, "-o", os.path.join(tmp, "cut.html"))
    n = text.count("\n")
    check("loom report skips a cut final line with a note",
          p.returncode == 0 and f"cut.jsonl:{n}" in p.stderr and "skipped" in p.stderr
          and not lib.error_lines(p.stderr), f"exit {p.returncode}: {p.stderr[-300:]}")
    lines = text.splitlines(True)
    mid = os.path.join(tmp, "mid.jsonl")
    with open(mid, "w") as f:
        f.write("".join(lines[:2]) + lines[2][:30] + "\n" + "".join(lines[3:]))
    p = lib.loom("report", mid, "-o", os.path.join(tmp, "mid.html"))
    errs = lib.error_lines(p.stderr)
    check("loom report still refuses a corrupt line in the middle, naming it",
          p.returncode == 2 and len(errs) == 1 and "mid.jsonl:3" in errs[0], p.stderr[-300:])


def report_writer(tmp):
    good = os.path.join(tmp, "good.jsonl")
    page = os.path.join(tmp, "page.html")
    with open(page, "w") as f:
        f.write("an earlier page\n")
    p = lib.run([LOOM, "report", good, "-o", page], timeout=60, preexec_fn=limited(2048))
    errs = lib.error_lines(p.stderr)
    check("loom report on a full disk: exit 1, one line naming the page and the cause",
          p.returncode == 1 and len(errs) == 1 and page in errs[0] and "too large" in errs[0].lower(),
          f"exit {p.returncode}: {p.stderr[-300:]}")
    check("... and the earlier page is kept, no cut page or temporary file left",
          open(page).read() == "an earlier page\n" and not [x for x in os.listdir(tmp) if x.startswith("page.html.")],
          str(sorted(os.listdir(tmp))))


def trace_full(tmp):
    trace = os.path.join(tmp, "trace.json")
    p = train(tmp, ["--train-iters", "3", "--trace", trace], limit=4096)
    errs = lib.error_lines(p.stderr)
    check("--trace on a full disk: exit 1, one line naming the file and the cause",
          p.returncode == 1 and len(errs) == 1 and f"--trace {trace}" in errs[0] and "too large" in errs[0].lower(),
          f"exit {p.returncode}: {p.stderr[-300:]}")


def eval_full(tmp):
    save = os.path.join(tmp, "evalsave")
    train(tmp, ["--train-iters", "2", "--save", save])
    p = lib.run([LOOM, "eval", "--load", save, "--valid-data-path", os.path.join(tmp, "train.bin"), "--eval-iters",
                 "2", "--threads", "1", "--metrics", "/dev/full"], timeout=60, env=ENV_LIMITED)
    errs = lib.error_lines(p.stderr)
    check("loom eval --metrics on a full disk (/dev/full): exit 1, one line naming the file and the cause",
          p.returncode == 1 and len(errs) == 1 and "--metrics /dev/full" in errs[0] and "No space" in errs[0],
          f"exit {p.returncode}: {p.stderr[-300:]}")


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        tensorboard_full(tmp)
        metrics_full(tmp)
        report_reader(tmp)
        report_writer(tmp)
        trace_full(tmp)
        eval_full(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
