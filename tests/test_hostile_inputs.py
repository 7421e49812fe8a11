"""Hostile input files: each refused at once, in one line, without a hang
or a memory blow-up.

- A FIFO (no writer ever comes) in the place of every file loom reads:
  --deepspeed-config, a Hugging Face config.json, GPT-2's vocab.json, the
  input of `loom convert`, of `loom data tokenize` (with and without
  --tokenizer) and of `loom data train-tokenizer`, `loom launch
  --hostfile`; and --metrics and --trace, outputs, where a FIFO would wait
  for a reader (a regular file or a character device such as /dev/null is
  taken). Each: exit 2 within the
  timeout, one error line naming the path.
- A DeepSpeed config with 80,000 keys in one object: the duplicate-key
  check's CPU time grows less than 16x from 10,000 keys (it was quadratic:
  25x, 19.5 s); a duplicate among them is still named.
- Safetensors headers of 16 MB (small entries, one long array, many
  metadata pairs), each refused: peak memory at most 6 times the header
  (it was 15 to 40 times); a header length past the file's end is refused
  before anything is read.

Every run has a timeout, so a hang fails the check instead of blocking.
"""
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile

import lib
from lib import check, verdict

HANG = 10  # seconds: a refusal is immediate; past this, it waited on the FIFO


def run(args, timeout=HANG):
    """(returncode, stderr) of loom ARGS; (None, 'hung') past the timeout."""
    try:
        p = lib.loom(*args, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "hung (killed after %d s)" % timeout
    return p.returncode, p.stderr


def refused(name, args, path, needle="not a regular file"):
    rc, err = run(args)
    errs = lib.error_lines(err) if rc is not None else []
    check(f"{name}: exit 2, one line naming {os.path.basename(path)}",
          rc == 2 and len(errs) == 1 and path in errs[0] and needle in errs[0], f"exit {rc}: {err[-300:]}")


def write_st(path, tensors, header_pad=b""):
    """A safetensors file of F32 zeros: tensors is [(name, shape)]."""
    hdr, off = {}, 0
    for name, shape in tensors:
        n = 4
        for d in shape:
            n *= d
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr).encode() + header_pad
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"\0" * off)


def fifos(tmp):
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    corpus = os.path.join(tmp, "c.jsonl")
    with open(corpus, "w") as f:
        for i in range(100):
            f.write(json.dumps({"text": f"document {i}: the quick brown fox"}) + "\n")
    tok = os.path.join(tmp, "tok")
    p = lib.loom("data", "train-tokenizer", "--vocab-size", "300", "--no-progress", corpus, tok)
    check("a tokenizer to test with", p.returncode == 0, p.stderr[-300:])

    refused("--deepspeed-config a FIFO", ["train", "--dry-run", "--deepspeed-config", fifo], fifo)
    hf = os.path.join(tmp, "hf")
    os.mkdir(hf)
    write_st(os.path.join(hf, "model.safetensors"), [("wte.weight", [8, 4]), ("wpe.weight", [8, 4])])
    os.mkfifo(os.path.join(hf, "config.json"))
    refused("a Hugging Face config.json that is a FIFO", ["convert", hf, os.path.join(tmp, "o.bin")],
            os.path.join(hf, "config.json"))
    g2 = os.path.join(tmp, "gpt2tok")
    os.mkdir(g2)
    os.mkfifo(os.path.join(g2, "vocab.json"))
    with open(os.path.join(g2, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    refused("GPT-2's vocab.json a FIFO", ["data", "tokenize", "--tokenizer", g2, corpus, os.path.join(tmp, "o1")],
            os.path.join(g2, "vocab.json"))
    os.remove(os.path.join(g2, "vocab.json"))
    with open(os.path.join(g2, "vocab.json"), "w") as f:
        json.dump({"a": 0, "<|endoftext|>": 1}, f)
    os.remove(os.path.join(g2, "merges.txt"))
    os.mkfifo(os.path.join(g2, "merges.txt"))
    refused("GPT-2's merges.txt a FIFO", ["data", "tokenize", "--tokenizer", g2, corpus, os.path.join(tmp, "o1")],
            os.path.join(g2, "merges.txt"))
    refused("loom convert IN a FIFO", ["convert", fifo, os.path.join(tmp, "o.bin")], fifo)
    out = os.path.join(tmp, "o2")
    refused("loom data tokenize --tokenizer: IN a FIFO", ["data", "tokenize", "--tokenizer", tok, corpus, fifo, out],
            fifo)
    check("... and no shard was written", not os.path.exists(out) or not os.listdir(out), str(os.listdir(tmp)))
    refused("loom data tokenize (byte-level): IN a FIFO", ["data", "tokenize", fifo, os.path.join(tmp, "o3")], fifo)
    refused("loom data train-tokenizer: IN a FIFO",
            ["data", "train-tokenizer", "--vocab-size", "300", fifo, os.path.join(tmp, "o4")], fifo)
    refused("loom launch --hostfile a FIFO",
            ["launch", "--nproc-per-node", "1", "--hostfile", fifo, "--", "train", "--dry-run"], fifo)
    refused("--metrics a FIFO (an output no reader drains)",
            ["train", "--metrics", fifo, "--train-iters", "1", "--num-layers", "1", "--hidden-size", "16",
             "--num-attention-heads", "2", "--seq-length", "8", "--micro-batch-size", "1"], fifo)
    refused("--trace a FIFO (an output no reader drains)",
            ["train", "--trace", fifo, "--train-iters", "1", "--num-layers", "1", "--hidden-size", "16",
             "--num-attention-heads", "2", "--seq-length", "8", "--micro-batch-size", "1"], fifo)


def cpu_seconds(args):
    """(returncode, CPU seconds) of loom ARGS: user and system time, which a
    loaded machine does not stretch as it does the wall clock."""
    p = subprocess.Popen([lib.LOOM] + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), ru.ru_utime + ru.ru_stime


def many_keys(tmp):
    # The duplicate-key check's growth, not a time: its CPU time for 80,000 keys against 10,000 (8x the keys)
    # grows 64x when the check compares every pair, and about 9x when it sorts (8x log); start-up, the same
    # for both, only lowers the ratio (measured: 25x for the pairwise check, 19.5 s of CPU for the 80,000; 3x sorted).
    paths = {}
    for n in (10000, 80000):
        paths[n] = os.path.join(tmp, f"keys{n}.json")
        with open(paths[n], "w") as f:
            json.dump({f"k{i:06d}": i for i in range(n)}, f)
    cpu = {10000: [], 80000: []}
    for _ in range(3):  # alternating, the median of each
        for n in (10000, 80000):
            rc, t = cpu_seconds(["train", "--dry-run", "--deepspeed-config", paths[n]])
            cpu[n].append(t if rc == 0 else float("inf"))
    small, big_t = sorted(cpu[10000])[1], sorted(cpu[80000])[1]
    ratio = big_t / max(small, 1e-3)
    check(f"--deepspeed-config with 80,000 keys in one object: {big_t:.2f} s of CPU, {ratio:.1f}x the 10,000 keys' "
          f"(under 16: not quadratic)", ratio < 16, f"{cpu}")
    keys = {f"k{i:06d}": i for i in range(80000)}
    dup = os.path.join(tmp, "dup.json")
    with open(dup, "w") as f:
        f.write(json.dumps(keys)[:-1] + ', "k079998": 1}')
    rc, err = run(["train", "--dry-run", "--deepspeed-config", dup], timeout=60)
    errs = lib.error_lines(err) if rc is not None else []
    check("... and a key given twice among them is named", rc == 2 and len(errs) == 1 and '"k079998"' in errs[0],
          f"exit {rc}: {err[-300:]}")
    nested = os.path.join(tmp, "nested.json")
    with open(nested, "w") as f:
        f.write('{"a": {"x": 1, "x": 2}, "b": 1, "b": 2}')
    rc, err = run(["train", "--dry-run", "--deepspeed-config", nested])
    errs = lib.error_lines(err) if rc is not None else []
    check("the first repeat in document order is the one named (a.x before b)",
          rc == 2 and len(errs) == 1 and '"a.x"' in errs[0], f"exit {rc}: {err[-300:]}")


def peak_rss_mb(args):
    """(returncode, stderr, peak resident MB) of loom ARGS, measured alone in
    a child of a fresh interpreter."""
    probe = ("import resource, subprocess, sys\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "sys.stderr.write(p.stderr)\n"
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    q = subprocess.run([sys.executable, "-c", probe, lib.LOOM, *args], capture_output=True, text=True, timeout=120)
    rc, kb = q.stdout.split()
    return int(rc), q.stderr, int(kb) / 1024


def st_header(path, body):
    h = body + b" " * ((8 - len(body) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
    return len(h) / 2**20


def big_headers(tmp):
    """Headers of 16 MB that are refused; peak memory within a few times the
    header (a whole tree of it cost 15 and 40 times)."""
    _, _, base = peak_rss_mb(["convert", os.path.join(tmp, "none.safetensors"), os.path.join(tmp, "o.bin")])
    n = 16 << 20
    parts, size, i = [], 0, 0
    while size < n:  # small valid entries, the first name repeated at the end
        parts.append(b'"t%08d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i)
        size += len(parts[-1]) + 1
        i += 1
    parts.append(parts[0])
    cases = [("entries", b"{" + b",".join(parts) + b"}", "appears twice"),
             ("a long array", b'{"x":{"dtype":"F32","shape":[' + b"0," * (n // 2) + b'0],"data_offsets":[0,0]}}',
              "'x'"),
             ("metadata pairs", b'{"__metadata__":{' + b",".join(b'"k%07d":"v"' % j for j in range(n // 14)) +
              b',"k0000000":"w"}}', "appears twice")]
    for name, body, needle in cases:
        path = os.path.join(tmp, "big.safetensors")
        mb = st_header(path, body)
        rc, err, rss = peak_rss_mb(["convert", path, os.path.join(tmp, "o.bin")])
        errs = lib.error_lines(err)
        check(f"a {mb:.0f} MB safetensors header of {name}: exit 2 in one line, peak memory {rss - base:.0f} MB "
              f"over the baseline (at most 6 times the header)",
              rc == 2 and len(errs) == 1 and needle in errs[0] and rss - base <= 6 * mb, f"exit {rc}: {err[-300:]}")
    path = os.path.join(tmp, "short.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 90_000_000) + b"{}")
    rc, err, rss = peak_rss_mb(["convert", path, os.path.join(tmp, "o.bin")])
    check(f"a header length past the end of the file: refused at once ({rss - base:.0f} MB over the baseline)",
          rc == 2 and "exceeds" in err and rss - base < 8, f"exit {rc}: {err[-300:]}")


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        fifos(tmp)
        many_keys(tmp)
        big_headers(tmp)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
