"""Hostile input files: each refused at once, in one line, without a hang
or a memory blow-up.

- A FIFO (no writer ever comes) in the place of every file loom reads:
  --deepspeed-config, a Hugging Face config.json, GPT-2's vocab.json, the
  input of `loom convert`, of `loom data tokenize` (with and without
  --tokenizer) and of `loom data train-tokenizer`; and --metrics, an
  output, where a FIFO would wait for a reader. Each: exit 2 within the
  timeout, one error line naming the path.
- A DeepSpeed config with 80,000 keys in one object: the duplicate-key
  check takes well under a second (it was quadratic); a duplicate among
  them is still named.
- A safetensors header of tens of MB: refused with peak memory a small
  multiple of the header, not tens of times it.

Every run has a timeout, so a hang fails the check instead of blocking.
"""
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time

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
    refused("--metrics a FIFO (an output no reader drains)",
            ["train", "--metrics", fifo, "--train-iters", "1", "--num-layers", "1", "--hidden-size", "16",
             "--num-attention-heads", "2", "--seq-length", "8", "--micro-batch-size", "1"], fifo)


def many_keys(tmp):
    keys = {f"k{i:06d}": i for i in range(80000)}
    big = os.path.join(tmp, "big.json")
    with open(big, "w") as f:
        json.dump(keys, f)
    t0 = time.time()
    rc, err = run(["train", "--dry-run", "--deepspeed-config", big], timeout=60)
    dt = time.time() - t0
    check(f"--deepspeed-config with 80,000 keys in one object: read in {dt:.1f} s (under 6)",
          rc == 0 and dt < 6, f"exit {rc}: {err[-300:]}")
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


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        fifos(tmp)
        many_keys(tmp)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
