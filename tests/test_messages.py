"""Messages that must not mislead: each bad input below gets one error line
that names the flag or field at fault and says what is actually wrong, and
exit status 2. A stated range holds the bound the check enforces (--adam-beta2
1 is refused, and the upper bound the message gives is accepted); a --load
path that is not there names --load; free space on a small --nvme-path is
printed in a unit that shows it; a config.json field given with a value the
tensors contradict is not called absent; an unpaired UTF-16 surrogate in
config.json is called that, not "not a JSON object"; a safetensors shape
whose dimension does not fit a model size is named as such. And the hang
report's summary of the ranks that never reached a collective is printed
once by each waiting rank, not again at the deadline after a stop signal."""
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

import lib
from lib import LOOM, check

TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--vocab-size", "256", "--threads", "1", "--eval-iters", "0"]


def one_error(p, needles):
    """Exit 2 and exactly one error line, holding every needle; (ok, detail)."""
    errs = lib.error_lines(p.stderr)
    ok = p.returncode == 2 and len(errs) == 1 and all(n in errs[0] for n in needles)
    return ok, f"exit {p.returncode}: {p.stderr.strip()[-400:]}"


def test_beta_range(tmp):
    """The range stated for --adam-beta2 is the one checked: 1 is outside it,
    and its upper bound is accepted."""
    p = lib.loom("train", "--adam-beta2", "1", "--train-iters", "1")
    ok, detail = one_error(p, ["--adam-beta2", "'1'"])
    m = re.search(r"in ([\[(])([^,]+), ([^\])]+)([\])])", p.stderr)
    if not m:
        check("--adam-beta2 1: exit 2, one line naming the flag and a range", False, detail)
        return
    lo, hi, closed = float(m.group(2)), float(m.group(3)), m.group(4) == "]"
    check(f"--adam-beta2 1: exit 2, one line naming the flag, 1 outside the range stated ({m.group(0)})",
          ok and (hi < 1 or (hi == 1 and not closed)), detail)
    if closed:
        p = lib.loom("train", "--data-path", os.path.join(tmp, "d", "train.bin"), *TINY, "--train-iters", "2",
                     "--adam-beta2", m.group(3), "--log-interval", "1")
        check(f"--adam-beta2 {m.group(3)}, the stated upper bound: accepted, and the loss stays finite",
              p.returncode == 0 and "nan" not in p.stdout.lower(), p.stderr[-300:])


def test_load_missing(tmp):
    """A --load path that is not there: the flag, the path, and why."""
    missing = os.path.join(tmp, "no-such-checkpoints", "")
    for cmd in ("train", "eval"):
        p = lib.loom(cmd, "--load", missing, "--data-path", os.path.join(tmp, "d", "train.bin"), *TINY,
                     "--train-iters", "1")
        ok, detail = one_error(p, ["--load", missing, "No such file or directory"])
        check(f"loom {cmd} --load of a directory that is not there: exit 2, one line naming --load and the path",
              ok, detail)


def test_nvme_small(tmp):
    """A 64 KB file system as --nvme-path: the space needed and free are
    printed in a unit that shows them (not "0.00 GB"). The tmpfs is mounted
    in a user and mount namespace of its own (unshare), so the test needs no
    root; where namespaces are not allowed it says so and passes."""
    small = os.path.join(tmp, "small")
    os.mkdir(small)
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "d", "train.bin"), *lib.TINY_MODEL, "--train-iters", "1",
           "--offload-optimizer", "nvme", "--nvme-path", small]
    script = 'mount -t tmpfs -o size=64k tmpfs "$0" || exit 99; exec "$@"'
    try:
        p = lib.run(["unshare", "-rm", "sh", "-c", script, small, *cmd], timeout=120)
    except OSError:
        p = None
    if p is None or p.returncode == 99 or "unshare:" in p.stderr:
        print("note: no user namespaces here: the small --nvme-path case is not run")
        return
    ok, detail = one_error(p, ["--nvme-path", small, "needs", "free"])
    m = re.search(r"needs ([0-9.]+) (\w+) \(\d+ bytes\), ([0-9.]+) (\w+) free", p.stderr)
    check("a --nvme-path too small: exit 2, one line naming the flag, the space needed and free both non-zero in "
          "the unit printed", ok and m is not None and float(m.group(1)) > 0 and float(m.group(3)) > 0, detail)


def safetensors(path, tensors):
    """A safetensors file of the F32 tensors {name: shape}, zeros, or of the
    header entries {name: entry} as given and no data."""
    header, offset = {}, 0
    for name, t in tensors.items():
        if isinstance(t, dict):
            header[name] = t
            continue
        n = 4
        for d in t:
            n *= d
        header[name] = {"dtype": "F32", "shape": t, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(offset))


def test_hf_given_field(tmp):
    """config.json beside GPT-2 tensors of width 32: a given n_embd 64 is
    reported as the value given, an absent one as GPT2Config's default."""
    for tag, fields, want, not_want in (
            ("given", {"n_embd": 64}, "gives n_embd 64", "absent"),
            ("left out", {}, "leaves out n_embd", "gives")):
        d = os.path.join(tmp, f"hf-{tag.replace(' ', '-')}")
        os.mkdir(d)
        safetensors(os.path.join(d, "model.safetensors"),
                    {"wte.weight": [256, 32], "wpe.weight": [16, 32], "h.0.ln_1.weight": [32]})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_positions": 16, "vocab_size": 256,
                       **fields}, f)
        p = lib.loom("convert", d, os.path.join(tmp, "out.safetensors"))
        ok, detail = one_error(p, ["config.json", want, "32 columns of wte.weight"])
        check(f"config.json with n_embd {tag}, tensors of width 32: exit 2, one line saying it is {tag}",
              ok and not_want not in lib.error_lines(p.stderr)[0], detail)


def test_shape_overflow(tmp):
    """wte.weight [2^32 + 256, 0] (an empty tensor, so the file is valid):
    its first dimension does not fit a model size, which is what the line
    says, not hidden size 0 or a vocabulary of 256."""
    big = 2 ** 32 + 256
    path = os.path.join(tmp, "big.safetensors")
    safetensors(path, {"wte.weight": {"dtype": "F32", "shape": [big, 0], "data_offsets": [0, 0]},
                       "wpe.weight": {"dtype": "F32", "shape": [16, 0], "data_offsets": [0, 0]}})
    for tag, args in (("loom convert", ["convert", path, os.path.join(tmp, "out.safetensors")]),
                      ("loom train --load --finetune", ["train", "--load", path, "--finetune", "--train-iters", "1",
                                                         "--data-path", os.path.join(tmp, "d", "train.bin")])):
        p = lib.loom(*args)
        ok, detail = one_error(p, ["wte.weight", str(big)])
        check(f"{tag} of a shape [2^32+256, 0]: exit 2, one line naming the tensor and the dimension too large",
              ok and "hidden size 0" not in p.stderr and "larger than" in p.stderr, detail)


def test_lone_surrogate(tmp):
    """config.json with a string holding an unpaired \\ud800: called a
    surrogate without its other half, not "not a JSON object"; a proper
    pair is read."""
    d = os.path.join(tmp, "hf-surrogate")
    os.mkdir(d)
    safetensors(os.path.join(d, "model.safetensors"),
                {"wte.weight": [256, 32], "wpe.weight": [16, 32], "h.0.ln_1.weight": [32]})
    fields = '"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 16, "vocab_size": 256'
    for name, text, lone in (("an unpaired \\ud800", "a\\ud800b", True),
                             ("a surrogate pair", "a\\ud83d\\ude00b", False)):
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write('{' + fields + ', "_name_or_path": "' + text + '"}')
        p = lib.loom("convert", d, os.path.join(tmp, "out.safetensors"))
        if lone:
            ok, detail = one_error(p, ["config.json", "\\ud800", "surrogate"])
            check(f"config.json with {name}: exit 2, one line naming the escape", ok and "JSON object" not in p.stderr,
                  detail)
        else:
            check(f"config.json with {name}: read (the failure is past it)", "config.json" not in p.stderr, p.stderr)


def test_hang_summary_once(tmp):
    """Rank 1 of 3 stalls before step 2; one SIGTERM reaches the waiting
    ranks, whose report names rank 1; the deadline (4 s) then ends the job.
    Each waiting rank prints its never-reached summary once, not again at
    the deadline."""
    metrics, marker = os.path.join(tmp, "hang.jsonl"), os.path.join(tmp, "hang-marker")
    args = ["--data-path", os.path.join(tmp, "d", "train.bin"), *TINY, "--train-iters", "50", "--log-interval", "1",
            "--comm-timeout", "4", "--metrics", metrics, "--data-cache", marker]
    p = subprocess.Popen(lib.mpirun(3, [LOOM, "train"] + args, ["-x", "LOOM_TEST_STALL"]), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=dict(lib.ENV, LOOM_TEST_STALL="1:2"))
    deadline = time.time() + 60
    while time.time() < deadline and len(lib.metrics_rows(metrics)) < 1:
        time.sleep(0.05)
    time.sleep(0.5)
    for pid in lib.loom_ranks(marker):
        os.kill(pid, signal.SIGTERM)
    _, err, _ = lib.finish(p, 60)
    summary = {r: [l for l in err.splitlines() if f"[rank {r}] the dp group's ranks that never reached" in l]
               for r in (0, 2)}
    timed_out = "communication timeout" in err
    check("a hang reported on SIGTERM, then at the deadline: each waiting rank names rank 1 once",
          timed_out and all(len(summary[r]) == 1 and ": 1 (" in summary[r][0] for r in (0, 2)),
          "\n".join(l for l in err.splitlines() if "hang report" in l or "error" in l) or err[-500:])


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.synth(os.path.join(tmp, "d"), 20000)
        test_beta_range(tmp)
        test_load_missing(tmp)
        test_nvme_small(tmp)
        test_shape_overflow(tmp)
        test_hf_given_field(tmp)
        test_lone_surrogate(tmp)
        test_hang_summary_once(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
