"""Checkpoints: exact resume, layout-free loading, crash safety, damage.

Exact resume: 20 steps in one run against 10 steps, stop, --load, 10 more,
for one process and every parallel layout (DDP, ZeRO 1-3, ZeRO-1 with the
optimizer state offloaded to a file): every step's loss and gradient norm
(printed with 17 significant digits) and every tensor of the final
checkpoint, weights and both Adam moments, identical bit for bit.

Layout-free: a checkpoint written by 2 ranks resumes in 1 process and the
reverse, and one written under ZeRO-2 on 2 ranks resumes under ZeRO-3 on 4;
the continued losses match the uninterrupted run within 1e-5 relative (the
layouts sum gradients in different orders, so float32 rounding differs).

Crash and damage, each giving its clear message or falling back, never a
crash: a kill -9 at each step of a save (LOOM_TEST_CRASH_AT) and at random
moments, a truncated file, a flipped byte in a tensor and in the trainer
state, a header that lies about sizes, a full disk (a file-size limit),
checkpoints all damaged, and bad --load/--save paths. And `loom convert`
exports a sharded checkpoint's weights exactly.
"""
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import lib
from lib import ENV, LOOM, check
from pyref import ckpt, st

# Resuming under another layout (rank count, ZeRO stage) only reorders the
# float32 sums: lib.compare_runs' 1e-5 for the loss and its reason (measured
# at most 3.6e-8 here, with every run at --threads 1).
TOL = 1e-5


def train(tmp, save, np_ranks, flags, env=None, expect=0, preexec=None):
    """Runs loom train; returns (process, metrics rows of this run)."""
    metrics = os.path.join(tmp, "metrics-%d.jsonl" % random.getrandbits(32))
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--data-order", "shuffled", *lib.TINY_MODEL,
        "--global-batch-size", "8", "--micro-batch-size", "2", "--train-iters", "20", "--lr", "3e-3",
        "--lr-warmup-iters", "3", "--lr-decay-iters", "20", "--clip-grad", "0.5", "--weight-decay", "0.1", "--log-interval", "1",
        "--eval-iters", "0", "--threads", "1", "--seed", "7", "--metrics", metrics, "--save", save,
        "--ddp-bucket-size", "0.01", "--comm-timeout", "60"] + flags
    p = lib.run_ranks(np_ranks, cmd, expect=expect, tag=f"loom train {' '.join(flags)}", env=env or ENV,
                      preexec_fn=preexec)
    return p, lib.metrics_rows(metrics)


def losses(rows):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows]


def exact_resume(tmp, tag, np_ranks, flags):
    full_dir, cut_dir = os.path.join(tmp, tag + "-full"), os.path.join(tmp, tag + "-cut")
    _, full = train(tmp, full_dir, np_ranks, flags + ["--save-interval", "10"])
    _, first = train(tmp, cut_dir, np_ranks, flags + ["--train-iters", "10"])
    p, second = train(tmp, cut_dir, np_ranks, flags + ["--load", cut_dir])
    check(f"{tag}: resumed at step 11", "resumed at step 11" in p.stdout, p.stdout[-500:])
    got, want = losses(first + second), losses(full)
    check(f"{tag}: 20 steps' loss and grad norm identical bit for bit after resuming at 10",
          got == want and len(got) == 20, f"first difference: {next((g, w) for g, w in zip(got, want) if g != w) if got != want and len(got) == len(want) else (len(got), len(want))}")
    bad = lib.differing(ckpt.assemble(full_dir), ckpt.assemble(cut_dir))
    check(f"{tag}: final weights and optimizer state identical bit for bit", not bad, str(bad[:4]))
    return full_dir, full


def layout_free(tmp, tag, save_np, save_flags, load_np, load_flags):
    """Saved at 10 under one layout, continued under another; against the saving layout's full run."""
    full_dir, cut_dir = os.path.join(tmp, tag + "-full"), os.path.join(tmp, tag + "-cut")
    _, full = train(tmp, full_dir, save_np, save_flags)
    train(tmp, cut_dir, save_np, save_flags + ["--train-iters", "10"])
    p, rest = train(tmp, cut_dir, load_np, load_flags + ["--load", cut_dir])
    worst = max((abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rest, full[10:])), default=1.0)
    check(f"{tag}: steps 11-20 match the uninterrupted run within {TOL} relative (worst {worst:.2e})",
          len(rest) == 10 and [r["step"] for r in rest] == list(range(11, 21)) and worst <= TOL, p.stderr[-300:])


def copy_save(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def flip_byte(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


def damage_cases(tmp, base):
    """base: a save directory with iter_0000005 and iter_0000010 (latest)."""
    ref = json.load(open(os.path.join(base, "ref.json")))
    rank0 = "rank_00000.safetensors"

    def resume(name, save, expect_fallback, detail):
        p, rows = train(tmp, save, 1, ["--train-iters", "12", "--load", save], expect=None)
        got = losses(rows)
        want = [tuple(r) for r in ref if r[0] > (5 if expect_fallback else 10)]
        ok = p.returncode == 0 and got == want
        if expect_fallback:
            ok = ok and "falling back to" in p.stderr and "iter_0000005" in p.stderr and detail in p.stderr
        check(f"{name}: {'warns, falls back to iter_0000005 and ' if expect_fallback else ''}continues exactly", ok,
              f"exit {p.returncode}; {p.stderr[-600:]}")
        return p

    # a truncated file
    d = copy_save(base, os.path.join(tmp, "trunc"))
    f = os.path.join(d, "iter_0000010", rank0)
    os.truncate(f, os.path.getsize(f) // 2)
    resume("truncated rank file", d, True, rank0)
    p, _ = train(tmp, d, 1, ["--train-iters", "12", "--load", os.path.join(d, "iter_0000010")], expect=None)
    lines = lib.error_lines(p.stderr)
    check("truncated rank file named directly: exit 2, one line naming the file",
          p.returncode == 2 and len(lines) == 1 and rank0 in lines[0], p.stderr[-400:])

    # a flipped byte in the data of a tensor
    d = copy_save(base, os.path.join(tmp, "flip"))
    f = os.path.join(d, "iter_0000010", rank0)
    flip_byte(f, os.path.getsize(f) - 1000)
    resume("flipped byte in tensor data", d, True, "fails its checksum")
    p, _ = train(tmp, d, 1, ["--load", os.path.join(d, "iter_0000010")], expect=None)
    check("flipped byte named directly: exit 2 naming file and tensor",
          p.returncode == 2 and rank0 in p.stderr and "tensor" in p.stderr and "checksum" in p.stderr, p.stderr[-400:])

    # a flipped byte in the trainer state
    d = copy_save(base, os.path.join(tmp, "flipstate"))
    f = os.path.join(d, "iter_0000010", "trainer_state.json")
    text = open(f).read()
    open(f, "w").write(text.replace('"iteration":\t10', '"iteration":\t18').replace('"iteration": 10', '"iteration": 18'))
    check("trainer state was altered for the test", open(f).read() != text)
    resume("altered trainer state", d, True, "trainer_state.json")

    # a header that lies about sizes: one tensor's span runs past the end of the file (and its shape)
    d = copy_save(base, os.path.join(tmp, "lie"))
    f = os.path.join(d, "iter_0000010", rank0)
    raw = open(f, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n].decode()
    at = header.index('"data_offsets":[') + len('"data_offsets":[')
    end = header.index("]", at)
    first, last = header[at:end].split(",")
    lie = header[:at] + first + "," + "9" * len(last) + header[end:]  # same length, a span past the end
    open(f, "wb").write(raw[:8] + lie.encode() + raw[8 + n:])
    resume("header claiming a span past the end of the file", d, True, rank0)

    # every checkpoint damaged: an error, not a crash
    d = copy_save(base, os.path.join(tmp, "alldamaged"))
    for it in ("iter_0000005", "iter_0000010"):
        os.truncate(os.path.join(d, it, rank0), 100)
    p, _ = train(tmp, d, 1, ["--load", d], expect=None)
    check("all checkpoints damaged: exit 2 with one error line",
          p.returncode == 2 and len(lib.error_lines(p.stderr)) == 1, p.stderr[-400:])

    # a full disk: a file-size limit below the size of the rank file. The limit applies to every
    # file the process writes, and Open MPI's PMIx start-up writes a shared-memory store of a few MB:
    # PMIX_MCA_gds=hash keeps that store in memory, so only loom's own writes meet the limit.
    d = os.path.join(tmp, "full")
    tiny = ["--model", "gpt2-tiny", "--micro-batch-size", "4", "--save-interval", "2"]
    train(tmp, d, 1, tiny + ["--train-iters", "2"])
    size = os.path.getsize(os.path.join(d, "iter_0000002", rank0))
    limit = size // 2

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p, _ = train(tmp, d, 1, tiny + ["--train-iters", "4", "--load", d], env=dict(ENV, PMIX_MCA_gds="hash"),
                 expect=None, preexec=small_disk)
    lines = lib.error_lines(p.stderr)
    check(f"full disk ({size} byte file, {limit} byte limit): exit 1, one line naming the file and the cause",
          p.returncode == 1 and len(lines) == 1 and rank0 in lines[0] and "too large" in lines[0].lower(),
          p.stderr[-400:])
    check("full disk: latest still names iter_0000002, nothing half-written left",
          open(os.path.join(d, "latest")).read().strip() == "iter_0000002"
          and not [x for x in os.listdir(d) if x.startswith(".") and x != ".lock"] and not os.path.exists(os.path.join(d, "iter_0000004")),
          str(os.listdir(d)))
    p, rows = train(tmp, d, 1, tiny + ["--train-iters", "4", "--load", d], expect=None)
    check("after the full-disk failure the previous checkpoint resumes",
          p.returncode == 0 and [r["step"] for r in rows] == [3, 4], p.stderr[-300:])


def crash_cases(tmp, base):
    ref = json.load(open(os.path.join(base, "ref.json")))
    for point, kept in (("after-rank-file", 5), ("before-rename", 5), ("before-latest", 5), ("after-latest", 10)):
        d = copy_save(base, os.path.join(tmp, "crash-" + point))
        shutil.rmtree(os.path.join(d, "iter_0000010"))
        open(os.path.join(d, "latest"), "w").write("iter_0000005\n")
        env = dict(ENV, LOOM_TEST_CRASH_AT=point)
        p, _ = train(tmp, d, 1, ["--train-iters", "10", "--load", d], env=env, expect=None)
        latest = open(os.path.join(d, "latest")).read().strip()
        check(f"killed at {point}: died by SIGKILL, latest names iter_{kept:07d}",
              p.returncode == -signal.SIGKILL and latest == f"iter_{kept:07d}", f"exit {p.returncode}, latest {latest}")
        p, rows = train(tmp, d, 1, ["--train-iters", "12", "--load", d], expect=None)
        want = [tuple(r) for r in ref if r[0] > kept]
        check(f"killed at {point}: resumes from iter_{kept:07d} and continues exactly; leftovers cleaned",
              p.returncode == 0 and losses(rows) == want and not [x for x in os.listdir(d) if x.startswith(".") and x != ".lock"],
              f"exit {p.returncode} {p.stderr[-300:]} {os.listdir(d)}")


def resave(tmp, base):
    """A run resumed from iter_0000005 reaches iteration 10 again: the new iter_0000010 replaces
    the old one in one exchange (a kill at any moment leaves a complete one), and holds the same bits."""
    want = ckpt.assemble(os.path.join(base, "iter_0000010"))
    for crash in (None, "before-latest"):
        d = copy_save(base, os.path.join(tmp, f"resave-{crash}"))
        env = dict(ENV, LOOM_TEST_CRASH_AT=crash) if crash else ENV
        p, _ = train(tmp, d, 1, ["--train-iters", "10", "--save-interval", "5", "--load", os.path.join(d, "iter_0000005")],
                     env=env, expect=None)
        got = ckpt.assemble(os.path.join(d, "iter_0000010"))
        check(f"saving iteration 10 again{' (killed before latest moved)' if crash else ''}: a complete iter_0000010"
              f" with the same bits, latest names it",
              p.returncode == (-signal.SIGKILL if crash else 0) and not lib.differing(want, got)
              and open(os.path.join(d, "latest")).read().strip() == "iter_0000010", p.stderr[-300:])


def random_kills(tmp):
    """kill -9 at random moments of a run that saves every step: latest always loads."""
    d = os.path.join(tmp, "random-kill")
    flags = ["--model", "gpt2-tiny", "--save-interval", "1", "--train-iters", "1000", "--micro-batch-size", "4"]
    rng = random.Random(1)
    for trial in range(4):
        cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--threads", "1", "--eval-iters", "0",
               "--save", d, "--log-interval", "1000"] + flags + (["--load", d] if trial else [])
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
        # a first save before the random moment, however loaded the machine (start-up can take seconds)
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(d, "latest")) and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(rng.random() * 2)
        p.send_signal(signal.SIGKILL)
        p.wait()
        latest = ckpt.state(d)["iteration"] if os.path.exists(os.path.join(d, "latest")) else 0
        q = lib.loom("eval", "--load", d, "--data-path", os.path.join(tmp, "train.bin"), "--valid-data-path",
                     os.path.join(tmp, "train.bin"), "--eval-iters", "1", "--threads", "1", env=ENV)
        check(f"random kill {trial + 1}: killed with latest at iteration {latest}; the checkpoint loads",
              latest > 0 and q.returncode == 0 and "val loss" in q.stdout, q.stderr[-300:])


def main():
    random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        # exact resume, every layout
        _, ref_rows = exact_resume(tmp, "single", 1, [])
        exact_resume(tmp, "single-accumulate", 1, ["--micro-batch-size", "1"])
        exact_resume(tmp, "ddp-np2", 2, [])
        for stage in (1, 2, 3):
            exact_resume(tmp, f"zero{stage}-np2", 2, ["--zero-stage", str(stage), "--micro-batch-size", "1"])
        exact_resume(tmp, "zero1-np2-nvme", 2, ["--zero-stage", "1", "--offload-optimizer", "nvme", "--nvme-path", tmp,
                                                "--offload-buffer-size", "0.004"])
        exact_resume(tmp, "zero3-np2-offload-param-bf16", 2,
                     ["--zero-stage", "3", "--bf16", "--offload-optimizer", "nvme", "--offload-param", "nvme",
                      "--nvme-path", tmp, "--offload-buffer-size", "0.05"])
        # layout-free
        layout_free(tmp, "np2-to-np1", 2, [], 1, [])
        layout_free(tmp, "np1-to-np2", 1, [], 2, [])
        layout_free(tmp, "zero2-np2-to-zero3-np4", 2, ["--zero-stage", "2"], 4,
                    ["--zero-stage", "3", "--micro-batch-size", "1", "--zero3-min-params", "3000"])
        layout_free(tmp, "zero3-np4-to-zero1-np2", 4, ["--zero-stage", "3"], 2, ["--zero-stage", "1"])

        # loom convert reads a checkpoint of any layout: here the one ZeRO-3 on 4 ranks wrote
        d = os.path.join(tmp, "zero2-np2-to-zero3-np4-cut")
        hf = os.path.join(tmp, "hf")
        p = lib.loom("convert", d, hf, env=ENV)
        want = ckpt.weights(d)
        got = st.load(os.path.join(hf, "model.safetensors")) if p.returncode == 0 else {}
        bad = lib.differing(want, got)
        check("loom convert: a 4-rank ZeRO-3 checkpoint to a Hugging Face directory, every weight bit for bit",
              p.returncode == 0 and not bad and json.load(open(os.path.join(hf, "config.json")))["n_head"] == 4,
              p.stderr[-300:] + str(bad[:3]))

        # a save directory with two checkpoints, and the reference losses after them
        base = os.path.join(tmp, "base")
        _, rows = train(tmp, base, 1, ["--train-iters", "10", "--save-interval", "5"])
        _, more = train(tmp, os.path.join(tmp, "ref12"), 1, ["--train-iters", "12"])
        json.dump(losses(more), open(os.path.join(base, "ref.json"), "w"))
        check("reference: the first 10 steps agree with the 20-step run",
              losses(rows) == losses(ref_rows)[:10] == losses(more)[:10])
        damage_cases(tmp, base)
        crash_cases(tmp, base)
        resave(tmp, base)
        random_kills(tmp)

        # keep-last
        d = os.path.join(tmp, "keep")
        train(tmp, d, 1, ["--train-iters", "10", "--save-interval", "2", "--keep-last", "2"])
        check("--keep-last 2 keeps iter_0000008 and iter_0000010",
              sorted(x for x in os.listdir(d) if x.startswith("iter_")) == ["iter_0000008", "iter_0000010"],
              str(os.listdir(d)))

        # --finetune: the weights alone, from step 1, as from a weights file holding them
        weights = os.path.join(tmp, "w.safetensors")
        st.save(weights, ckpt.weights(base))
        _, a = train(tmp, os.path.join(tmp, "ft1"), 1, ["--train-iters", "5", "--load", base, "--finetune"])
        _, b = train(tmp, os.path.join(tmp, "ft2"), 1, ["--train-iters", "5", "--load", weights])
        check("--finetune starts at step 1 from the weights: same run as from a weights file",
              losses(a) == losses(b) and [r[0] for r in losses(a)] == [1, 2, 3, 4, 5])

        # bad paths and mismatches: one line, exit 2, before training
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        afile = os.path.join(tmp, "afile")
        open(afile, "w").write("x")
        cases = [("--load of a missing path", ["--load", os.path.join(tmp, "nope")], "nope"),
                 ("--load of a directory with no checkpoint", ["--load", empty], "no checkpoint"),
                 ("--save under a regular file", ["--save", os.path.join(afile, "sub")], "afile"),
                 ("--load of a checkpoint of another model shape", ["--load", base, "--hidden-size", "64"],
                  "--hidden-size 32")]
        for name, flags, want in cases:
            p, rows = train(tmp, os.path.join(tmp, "bad"), 1, flags, expect=None)
            lines = lib.error_lines(p.stderr)
            check(f"{name}: exit 2, one line naming it, no step run",
                  p.returncode == 2 and len(lines) == 1 and want in lines[0] and not rows, p.stderr[-300:])
        recorded_model(tmp, base)
    return lib.verdict()


def recorded_model(tmp, base):
    """The model a checkpoint records is read as its family reads it, by
    eval as by train: a setting the family does not know is refused, and one
    an older checkpoint lacks has its value of then (here a flag giving
    another is a contradiction). The edited trainer state is resealed with
    its checksum (tests/tools/state_tool) so the checks behind it run."""
    seal = lib.tool("state_tool")
    for tag, edit, flags, want in (
            ("a model setting the family does not know", lambda m: dict(m, rotary_base=10000), [], "rotary_base"),
            ("a checkpoint from before norm_epsilon, and --norm-epsilon 0.01",
             lambda m: {k: v for k, v in m.items() if k != "norm_epsilon"}, ["--norm-epsilon", "0.01"],
             "--norm-epsilon")):
        d = os.path.join(tmp, "edited-" + tag.split()[1])
        copy_save(base, d)
        it = ckpt.checkpoint_dir(d)  # that checkpoint alone: no fallback to an older one
        state = os.path.join(it, "trainer_state.json")
        doc = json.load(open(state))
        doc["model"] = edit(doc["model"])
        with open(state, "w") as f:
            f.write(json.dumps(doc, separators=(",", ":")))  # the checksum stays the first key
        p = lib.run([seal, "seal", state])
        check(f"{tag}: the edited trainer state is sealed", p.returncode == 0, p.stderr)
        for cmd in ("eval", "train"):
            p = lib.loom(cmd, "--load", it, *flags, "--train-iters", "1", "--data-path", os.path.join(tmp, "train.bin"),
                         "--valid-data-path", os.path.join(tmp, "train.bin"), "--eval-iters", "1", timeout=300)
            lines = lib.error_lines(p.stderr)
            check(f"loom {cmd} of {tag}: exit 2, one line naming it",
                  p.returncode == 2 and len(lines) == 1 and want in lines[0], p.stderr[-300:])
        if flags:  # without the contradicting flag, the older checkpoint evaluates (GPT-2's eps 1e-5)
            p = lib.loom("eval", "--load", it, "--valid-data-path", os.path.join(tmp, "train.bin"), "--eval-iters",
                         "1", timeout=300)
            check(f"loom eval of {tag.split(',')[0]}, no flag: runs", p.returncode == 0, p.stderr[-300:])


if __name__ == "__main__":
    sys.exit(main())
