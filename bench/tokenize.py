"""Tokenizing a corpus: `loom data tokenize --tokenizer` against Hugging Face
`tokenizers`' batch encoding, on 2 cores.

    make && /usr/bin/python3 bench/tokenize.py [--mb 60] [--rounds 3] [--pattern gpt2|llama3]

The peer is what a user preparing data runs today: `tokenizers` from PyPI
(installed by this script into its own virtual environment,
build/bench-tokenizers, once; never a dependency of loom), its
`Tokenizer.encode_batch` over all documents (Rust, every core: 2 here).

The corpus (--mb megabytes, default 60) is real text found on any Debian
machine: Debian changelogs (English prose, names, dates, versions) and the
Python standard library's sources (code), cut into documents of about 4 KB
at line ends, shuffled with a fixed seed, written as one .jsonl. The
tokenizer is GPT-2-shaped (ByteLevel pre-tokenizer; or Llama 3's pattern),
trained by `tokenizers` on the first 8 MB with a 32,000-token vocabulary.

Columns, alternating loom, tokenizers, loom, ... (fresh processes):
- loom: wall time of the whole command (reading the .jsonl, parsing,
  encoding, writing shards);
- tokenizers: the time of encode_batch alone (reading and json.loads of the
  documents not counted, so the ratio favours the peer);
and the median of the per-round ratios. The ids are checked equal (loom's
shards against tokenizers' ids, end-of-text between documents) once.
"""
import argparse
import glob
import gzip
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
LOOM = os.path.join(BUILD, "loom")
VENV = os.path.join(BUILD, "bench-tokenizers")
PY = os.path.join(VENV, "bin", "python")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")

PEER = r'''
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
t0 = time.time()
enc = tok.encode_batch(docs, add_special_tokens=False)
dt = time.time() - t0
if len(sys.argv) > 3:
    eot = tok.token_to_id("<|endoftext|>")
    with open(sys.argv[3], "w") as f:
        json.dump([t for e in enc for t in [eot] + e.ids], f)
print(json.dumps({"seconds": dt, "tokens": sum(len(e.ids) for e in enc)}))
'''

TRAIN = r'''
import json, sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE())
if sys.argv[3] == "llama3":
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(sys.argv[4]), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
else:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"], show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
docs, n = [], 0
for line in open(sys.argv[1], encoding="utf-8"):
    docs.append(json.loads(line)["text"])
    n += len(docs[-1])
    if n > 8e6:
        break
tok.train_from_iterator(docs, trainer)
tok.save(sys.argv[2])
'''


def ensure_tokenizers():
    if not os.path.exists(PY):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    p = subprocess.run([PY, "-c", "import tokenizers; print(tokenizers.__version__)"], capture_output=True, text=True)
    if p.returncode != 0:
        print("tokenize: installing tokenizers from PyPI into", VENV, flush=True)
        subprocess.run([PY, "-m", "pip", "install", "-q", "tokenizers"], check=True)
        p = subprocess.run([PY, "-c", "import tokenizers; print(tokenizers.__version__)"], capture_output=True,
                           text=True, check=True)
    return p.stdout.strip()


def make_corpus(path, mb):
    rng = random.Random(0)
    sources = []
    for f in sorted(glob.glob("/usr/share/doc/*/changelog*.gz")):
        try:
            sources.append(gzip.open(f, "rt", encoding="utf-8", errors="replace").read())
        except OSError:
            pass
    for f in sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True)):
        try:
            sources.append(open(f, encoding="utf-8").read())
        except (OSError, UnicodeDecodeError):
            pass
    docs, total = [], 0
    rng.shuffle(sources)
    for s in sources:
        lines = s.splitlines(keepends=True)
        cur = []
        for line in lines:
            cur.append(line)
            if sum(map(len, cur)) > 4000:
                docs.append("".join(cur))
                total += len(docs[-1].encode())
                cur = []
        if total > mb * 1e6:
            break
    rng.shuffle(docs)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    return len(docs), os.path.getsize(path)


def read_shards(d):
    out = []
    for n in sorted(glob.glob(os.path.join(d, "train_*.bin"))):
        with open(n, "rb") as f:
            head = struct.unpack("<256i", f.read(1024))
            out += struct.unpack(f"<{head[2]}H", f.read())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pattern", default="gpt2", choices=["gpt2", "llama3"])
    args = ap.parse_args()
    version = ensure_tokenizers()
    with tempfile.TemporaryDirectory() as tmp:
        corpus, tok = os.path.join(tmp, "corpus.jsonl"), os.path.join(tmp, "tokenizer.json")
        n_docs, size = make_corpus(corpus, args.mb)
        subprocess.run([PY, "-c", TRAIN, corpus, tok, args.pattern, LLAMA3], check=True)
        print(f"corpus: {n_docs} documents, {size / 1e6:.1f} MB of .jsonl; tokenizers {version}; "
              f"pattern {args.pattern}, 32000 ids", flush=True)
        env = dict(os.environ, OMP_NUM_THREADS="2", RAYON_NUM_THREADS="2")
        # the same ids, once
        ids_path = os.path.join(tmp, "ids.json")
        subprocess.run([PY, "-c", PEER, tok, corpus, ids_path], check=True, env=env, capture_output=True)
        out = os.path.join(tmp, "check")
        subprocess.run([LOOM, "data", "tokenize", "--tokenizer", tok, corpus, out, "--val-fraction", "0",
                        "--no-progress"], check=True, env=env, capture_output=True)
        same = read_shards(out) == json.load(open(ids_path))
        print(f"loom's shards equal tokenizers' ids (end-of-text before each document): {same}", flush=True)
        loom_s, peer_s, ratios = [], [], []
        for r in range(args.rounds):
            out = os.path.join(tmp, f"out{r}")
            t0 = time.time()
            subprocess.run([LOOM, "data", "tokenize", "--tokenizer", tok, corpus, out, "--val-fraction", "0",
                            "--no-progress"], check=True, env=env, capture_output=True)
            a = time.time() - t0
            p = subprocess.run([PY, "-c", PEER, tok, corpus], check=True, env=env, capture_output=True, text=True)
            b = json.loads(p.stdout)["seconds"]
            loom_s.append(a)
            peer_s.append(b)
            ratios.append(b / a)
            print(f"round {r + 1}: loom {a:.2f} s ({size / 1e6 / a:.1f} MB/s), tokenizers encode_batch {b:.2f} s "
                  f"({size / 1e6 / b:.1f} MB/s): loom {b / a:.2f}x", flush=True)
        print(f"median: loom {statistics.median(loom_s):.2f} s, tokenizers {statistics.median(peer_s):.2f} s; "
              f"loom is {statistics.median(ratios):.2f}x tokenizers (median of {args.rounds} per-round ratios)")


if __name__ == "__main__":
    main()
