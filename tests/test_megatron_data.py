#!/usr/bin/env python3
"""Megatron's indexed datasets, blends and splits, against Megatron-Core
itself (PyPI `megatron-core`, CPU, tests only; tests/pyref/megatron_ref.py).

- `loom data tokenize --output-format megatron` (with and without
  --append-eod, and in Megatron's own spelling --input/--output-prefix/
  --json-keys) writes PREFIX_text_document.bin/.idx byte for byte as
  Megatron's tools/preprocess_data.py does on the same tokenizer and text
  (its Encoder and IndexedDatasetBuilder, driven the same way), empty
  documents included; Megatron-Core's IndexedDataset reads loom's files with
  the same documents;
- the samples loom reads, through the flags of `loom train` (the sizes,
  the split, the blend, the step's rows: tests/tools/megatron_samples), are
  Megatron-Core's BlendedMegatronDatasetBuilder's with the same seed: the
  first 2,000 training and 200 validation (and test) samples of a weighted
  blend of three datasets (uint16 and int32 tokens, empty documents) cut by
  --split; an unweighted blend; one dataset read for many epochs, with and
  without the last epoch shuffled apart; per-split blends
  (--train/valid/test-data-path); the same samples with --data-cache-path
  when the indices are written there and when a second open maps them. The
  sizes are Megatron's:
  train iters x global batch, (iters // eval interval + 1) x eval iters x
  global batch, eval iters x global batch;
- `loom train` on a blend: the losses of 2 data-parallel ranks equal one
  process's; a run stopped at step 4 and resumed reads the same samples (the
  same losses, bit for bit); the test split's loss is printed at the end;
- Megatron's tokenizer flags: --tokenizer-type GPT2BPETokenizer with
  --vocab-file/--merge-file of any names, and HuggingFaceTokenizer with
  --tokenizer-model, tokenize to the same bytes (and the first is saved in
  a checkpoint as tokenizer.json); Llama2Tokenizer naming a missing model,
  and without --tokenizer-model, are one line (tests/test_tokenizer_spm.py
  tokenizes with the SentencePiece names);
- every malformed input is one line naming the file or flag, exit 2: a
  truncated .idx, a pointer past the .bin, an unknown dtype code, a blend
  with a negative weight, a blend naming a missing dataset, a split with no
  documents, --split on token shards, --data-path mixed with per-split
  paths, a seed NumPy's generator cannot take, and Megatron's tokenizer
  flags given wrongly; a dataset truncated or rewritten under the run is
  one line naming it, exit 1.
"""
import json
import os
import random
import struct
import subprocess
import tempfile
import time

import lib
from lib import LOOM, check

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--vocab-size", "512"]
MEGATRON_CORE = ["--no-deps", "megatron-core==0.16.1", "packaging", "tokenizers==0.15.2"]
MEGATRON_VENV = os.path.join(lib.BUILD, "test-venv-megatron")
SAMPLES = lib.tool("megatron_samples")
REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyref", "megatron_ref.py")


def megatron(tmp, jobs):
    """Runs megatron_ref.py's jobs under the Megatron virtual environment."""
    py = lib.venv_python(MEGATRON_VENV, MEGATRON_CORE, "megatron")
    job, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
    with open(job, "w") as f:
        json.dump(jobs, f)
    p = lib.run([py, REF, job, out], timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: megatron_ref.py exited {p.returncode}: {p.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def corpus(path, n=300, seed=5):
    """Documents of varied length and script, a few empty."""
    rng = random.Random(seed)
    words = ["the", "model", "trains", "on", "tokens", "données", "数据", "🙂", "def f(x):", "return",
             "x + 1", "\n", "  ", "Megatron", "loom", "blend", "split", "ünïcödé", "42", "3.14"]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            k = 0 if i % 37 == 5 else rng.randint(1, 120)
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(k)), "id": i}) + "\n")


def loom_samples(split, count, flags):
    """(size, rows) that megatron_samples prints for `loom train FLAGS`."""
    p = lib.run([SAMPLES, split, str(count)] + flags, timeout=300)
    if p.returncode != 0:
        return None, p.stderr.strip()[-500:]
    lines = p.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("size "))
    loom_samples.said = lines[:at]
    return int(lines[at].split()[1]), [list(map(int, ln.split())) for ln in lines[at + 1:]]


def megatron_sizes(iters, gbs, eval_iters, eval_interval):
    """Megatron's training.py: the samples each split is asked for."""
    return [iters * gbs, (iters // eval_interval + 1) * eval_iters * gbs, eval_iters * gbs]


def same_streams(tag, ref, flags, counts):
    """One check: loom's first counts[k] samples of each split equal Megatron's."""
    ok, detail, said = True, "", []
    for k, name in enumerate(["train", "valid", "test"]):
        if ref[k] is None or not counts[k]:
            continue
        size, rows = loom_samples(name, counts[k], flags)
        if size is None:
            ok, detail = False, f"{name}: {rows}"
            break
        want = ref[k]["rows"][:counts[k]]
        rows = rows[:len(want)]  # past a stream's end loom starts it again; Megatron's stops
        first = next((i for i, (a, b) in enumerate(zip(rows, want)) if a != b), None)
        if size != ref[k]["size"] or len(rows) != len(want) or first is not None:
            ok = False
            detail += f"{name}: size {size} vs {ref[k]['size']}, {len(rows)} vs {len(want)} rows, first diff {first}; "
        said.append(f"{len(rows)} {name} of {size}")
    return check(f"{tag}: {', '.join(said)} samples equal Megatron-Core's", ok, detail)


def last_epoch_apart(prefix, n, T):
    """Whether GPTDataset shuffles the last epoch apart for n samples of T
    of the whole dataset: used for less than 80% (gpt_dataset.py's rule)."""
    with open(prefix + ".idx", "rb") as f:
        b = f.read()
    nseq = idx_header(prefix)[3]
    tpe = sum(struct.unpack(f"<{nseq}i", b[34:34 + 4 * nseq]))
    epochs = 1
    while epochs * tpe < n * T + 1:
        epochs += 1
    sans = ((epochs - 1) * tpe - 1) // T
    return epochs > 1 and n - sans < int(0.8 * ((tpe - 1) // T))


def idx_header(prefix):
    with open(prefix + ".idx", "rb") as f:
        head = f.read(34)
    return struct.unpack("<9sQBQQ", head)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        j = lambda *p: os.path.join(tmp, *p)  # noqa: E731
        corpus(j("docs.jsonl"))
        corpus(j("held.txt.jsonl"), n=60, seed=9)
        p = lib.loom("data", "train-tokenizer", "--vocab-size", "400", j("docs.jsonl"), j("tok"))
        if not check("train-tokenizer (vocabulary 400)", p.returncode == 0, p.stderr[-500:]):
            return lib.verdict()
        tok = j("tok", "tokenizer.json")

        # ---- writing: byte for byte Megatron's preprocessing -------------------------
        p1 = lib.loom("data", "tokenize", "--tokenizer", tok, "--output-format", "megatron", j("docs.jsonl"),
                      j("out", "eod"), "--append-eod", "--no-progress")
        p2 = lib.loom("data", "tokenize", "--tokenizer", tok, "--output-format", "megatron", "--input",
                      j("docs.jsonl"), "--output-prefix", j("out", "plain"), "--json-keys", "text",
                      "--no-progress")
        check("tokenize --output-format megatron, with --append-eod and in Megatron's spelling: exit 0",
              p1.returncode == 0 and p2.returncode == 0, p1.stderr[-300:] + p2.stderr[-300:])
        print(f"     {p1.stdout.strip()}")
        ref = megatron(tmp, [
            {"op": "preprocess", "tokenizer": tok, "input": j("docs.jsonl"), "key": "text",
             "prefix": j("ref_eod"), "append_eod": True},
            {"op": "preprocess", "tokenizer": tok, "input": j("docs.jsonl"), "key": "text",
             "prefix": j("ref_plain"), "append_eod": False},
            {"op": "read", "prefix": j("out", "eod_text_document")},
            {"op": "read", "prefix": j("ref_eod")},
        ])
        for mine, theirs in [("eod", "ref_eod"), ("plain", "ref_plain")]:
            same = all(open(j("out", f"{mine}_text_document{e}"), "rb").read() == open(j(f"{theirs}{e}"), "rb").read()
                       for e in (".bin", ".idx"))
            magic, version, code, nseq, ndoc = idx_header(j("out", f"{mine}_text_document"))
            check(f"{mine}: .bin and .idx equal Megatron's byte for byte ({nseq} sequences, {ndoc - 1} documents, "
                  f"dtype code {code})", same and magic == b"MMIDIDX\0\0" and version == 1 and code == 8)
        # Megatron's tokenizer flags: GPT-2's two files by their own names, and a Hugging Face tokenizer.json
        with open(tok) as f:
            model = json.load(f)["model"]
        with open(j("gpt2-vocab.json"), "w") as f:
            json.dump(model["vocab"], f)
        with open(j("gpt2-merges.txt"), "w") as f:
            f.write("#version: 0.2\n" + "\n".join(m if isinstance(m, str) else " ".join(m) for m in model["merges"]) + "\n")
        for tag, flags in [("GPT2BPETokenizer", ["--vocab-file", j("gpt2-vocab.json"), "--merge-file",
                                                 j("gpt2-merges.txt")]),
                           ("HuggingFaceTokenizer", ["--tokenizer-model", j("tok")])]:
            p = lib.loom("data", "tokenize", "--tokenizer-type", tag, *flags, "--output-format", "megatron", "--input",
                         j("docs.jsonl"), "--output-prefix", j("out", tag), "--append-eod", "--workers", "2",
                         "--no-progress")
            same = p.returncode == 0 and all(
                open(j("out", f"{tag}_text_document{e}"), "rb").read() == open(j(f"ref_eod{e}"), "rb").read()
                for e in (".bin", ".idx"))
            check(f"--tokenizer-type {tag} (Megatron's flags, --workers 2): the same bytes as Megatron's", same,
                  p.stderr[-400:])
        p = lib.loom("data", "tokenize", "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", j("x.model"),
                     "--output-format", "megatron", j("docs.jsonl"), j("out", "x"))
        lib.check_refused("--tokenizer-type Llama2Tokenizer naming a missing model", p, ["x.model"])
        tokenize_refusals = [
            ("GPT2BPETokenizer without --merge-file", ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                                                       j("gpt2-vocab.json")], ["--merge-file"]),
            ("HuggingFaceTokenizer without --tokenizer-model", ["--tokenizer-type", "HuggingFaceTokenizer"],
             ["--tokenizer-model"]),
            ("--tokenizer and --tokenizer-type both", ["--tokenizer", tok, "--tokenizer-type",
                                                       "HuggingFaceTokenizer", "--tokenizer-model", tok], ["twice"]),
            ("--vocab-file without --tokenizer-type", ["--tokenizer", tok, "--vocab-file", j("gpt2-vocab.json")],
             ["--tokenizer-type"]),
            ("an unknown --output-format", ["--tokenizer", tok, "--output-format", "arrow"], ["--output-format"]),
            ("--append-eod without --output-format megatron", ["--tokenizer", tok, "--append-eod"],
             ["--append-eod", "megatron"]),
            ("--val-fraction with --output-format megatron", ["--tokenizer", tok, "--output-format", "megatron",
                                                              "--val-fraction", "0.1"], ["val-fraction"]),
        ]
        for tag, flags, needles in tokenize_refusals:
            p = lib.loom("data", "tokenize", *flags, j("docs.jsonl"), j("out", "refused"))
            lib.check_refused(f"loom data tokenize: {tag}", p, needles)

        docs = ref[2]
        check(f"IndexedDataset reads loom's file: {len(docs)} documents ({sum(not d for d in docs)} empty), "
              f"each the tokenizer's ids and the end of text", docs == ref[3] and len(docs) == 300 and
              all(d[-1] == docs[0][-1] for d in docs if d))

        # ---- reading: the samples of Megatron's builder --------------------------------
        jobs = [{"op": "random", "prefix": j("r16"), "docs": 500, "vocab": 400, "seed": 3, "eod": 0, "max_len": 150},
                {"op": "random", "prefix": j("r32"), "docs": 200, "vocab": 70000, "seed": 4, "eod": 0,
                 "max_len": 200},
                {"op": "random", "prefix": j("small"), "docs": 40, "vocab": 400, "seed": 6, "eod": 0,
                 "max_len": 120}]
        megatron(tmp, jobs)
        base = ["--vocab-size", "70000", "--micro-batch-size", "8", "--global-batch-size", "8"]
        cases = []  # (tag, loom flags, Megatron's job, counts)

        def case(tag, words, split, seed, T, iters, eval_iters, eval_interval, per_split=None, counts=(2000, 200, 200)):
            flags = base + ["--seed", str(seed), "--seq-length", str(T), "--max-position-embeddings", str(T),
                            "--train-iters", str(iters), "--eval-iters", str(eval_iters),
                            "--eval-interval", str(eval_interval)]
            if per_split:
                for name, w in zip(["--train-data-path", "--valid-data-path", "--test-data-path"], per_split):
                    flags += [name] + w if w else []
            else:
                flags += ["--data-path"] + words + (["--split", split] if split else [])
            job = {"op": "samples", "seed": seed, "seq_length": T, "blend": None if per_split else words,
                   "blend_per_split": per_split, "split": None if per_split else (split or "969,30,1"),
                   "sizes": megatron_sizes(iters, 8, eval_iters, eval_interval), "count": list(counts),
                   "cache": j("cache")}
            cases.append((tag, flags, job, counts))

        eod = j("out", "eod_text_document")
        case("weighted blend of 3 (uint16, int32, loom's), --split 90,8,2", ["0.3", j("r16"), "0.5", j("r32"), "0.2", eod],
             "90,8,2", 1234, 64, 250, 25, 100)
        case("unweighted blend of 2, --split 80,15,5", [j("r16"), eod], "80,15,5", 7, 32, 300, 10, 50)
        # one small dataset (about 70 samples an epoch at T 32) read for about 20 epochs: 1,400 samples use
        # little of the last epoch (GPTDataset shuffles it apart), 1,496 most of it (shuffled with the rest)
        for n, apart in ((1400, True), (1496, False)):
            check(f"{n} samples of the small dataset: the last epoch {'' if apart else 'not '}apart",
                  last_epoch_apart(j("small"), n, 32) == apart)
            case(f"one dataset, many epochs, the last {'' if apart else 'not '}apart", [j("small")], "100,0,0", 99,
                 32, n // 8, 0, 1000, counts=(n, 0, 0))
        case("per-split blends", None, None, 42, 48, 200, 20, 100,
             per_split=[["0.6", j("r16"), "0.4", eod], [j("r32")], ["1", j("r16")]])
        refs = megatron(tmp, [c[2] for c in cases])
        for (tag, flags, _, counts), ref in zip(cases, refs):
            same_streams(tag, ref, flags, counts)
        # --data-cache-path: the indices written as .npy, then mapped by the next open (the same samples)
        tag, flags, _, counts = cases[0]
        cached = flags + ["--data-cache-path", j("lc")]
        for attempt, want in (("built into", "indices: 0 of 9 from the cache"),
                              ("mapped from", "indices: 9 of 9 from the cache")):
            loom_samples("train", 1, cached)
            said = " ".join(loom_samples.said)
            check(f"indices {attempt} --data-cache-path: '{want}'", want in said, said)
            same_streams(f"  {tag}, indices {attempt} the cache", refs[0], cached, counts)
        npys = sorted(n for n in os.listdir(j("lc")) if n.endswith(".npy"))
        check(f"  {len(npys)} .npy files (3 a GPTDataset, 2 a BlendedDataset) and their descriptions",
              len(npys) == 9 * 3 + 3 * 2 and sum(n.endswith("description.txt") for n in os.listdir(j("lc"))) == 12)

        # ---- training on a blend ----------------------------------------------------
        plain = j("out", "plain_text_document")
        data = ["--data-path", "0.7", eod, "0.3", plain, "--split", "90,8,2"]
        run = MODEL + data + ["--train-iters", "8", "--global-batch-size", "8", "--micro-batch-size", "4",
                              "--eval-iters", "2", "--eval-interval", "4", "--lr", "3e-3", "--seed", "3",
                              "--log-interval", "1", "--threads", "1", "--comm-timeout", "60"]

        def losses(tag, ranks, extra):
            m = j(f"{tag}.jsonl")
            p = lib.run_ranks(ranks, [LOOM, "train"] + run + ["--metrics", m] + extra, tag=tag)
            return [r["loss"] for r in lib.metrics_rows(m)], p

        one, p = losses("one", 1, [])
        check("loom train on a weighted blend cut by --split: 8 steps, validation, the test loss printed",
              len(one) == 8 and "test loss" in p.stdout and "val loss" in p.stdout, p.stdout[-800:] + p.stderr[-800:])
        two, _ = losses("dp2", 2, [])
        worst = max((lib.rel(a, b) for a, b in zip(two, one)), default=1.0)
        check(f"2 data-parallel ranks: the same {len(two)} losses (worst rel {worst:.1e}, tol 1e-5: the same "
              f"samples, gradients summed in another order)", len(two) == 8 and worst <= 1e-5, f"{two} vs {one}")
        half, _ = losses("half", 1, ["--save", j("ck"), "--exit-interval", "4", "--tokenizer-type", "GPT2BPETokenizer",
                                     "--vocab-file", j("gpt2-vocab.json"), "--merge-file", j("gpt2-merges.txt")])
        saved = [os.path.join(r, "tokenizer.json") for r, _, names in os.walk(j("ck")) if "tokenizer.json" in names]
        check("loom train --tokenizer-type GPT2BPETokenizer --vocab-file --merge-file: the checkpoint holds it as "
              "tokenizer.json", len(saved) == 1, str(saved))
        rest, _ = losses("rest", 1, ["--load", j("ck")])
        check("stopped at step 4 and resumed: the same 8 losses, bit for bit", half[:4] + rest == one,
              f"{half[:4] + rest} vs {one}")

        # ---- bad input: one line, exit 2 -------------------------------------------------
        def bad_copy(name, patch):
            for e in (".bin", ".idx"):
                with open(eod + e, "rb") as f, open(j(name + e), "wb") as g:
                    g.write(patch(f.read()) if e == ".idx" else f.read())
            return j(name)

        nseq = idx_header(eod)[3]
        last_ptr = 34 + 4 * nseq + 8 * (nseq - 1)
        refusals = [
            ("a truncated .idx", [bad_copy("short", lambda b: b[:100])], ["short.idx", "truncated"]),
            ("a pointer past the .bin", [bad_copy("far", lambda b: b[:last_ptr] + struct.pack("<q", 1 << 40) +
                                                  b[last_ptr + 8:])], ["far.idx", "outside", "far.bin"]),
            ("an unknown dtype code", [bad_copy("f64", lambda b: b[:17] + bytes([6]) + b[18:])],
             ["f64.idx", "dtype code 6"]),
            ("a blend with a negative weight", ["-0.5", eod, "1.5", plain], ["--data-path", "weight", "positive"]),
            ("a blend naming a missing dataset", ["0.5", eod, "0.5", j("nope")], ["nope", "no Megatron dataset"]),
        ]
        for tag, words, needles in refusals:
            p = lib.loom("train", *MODEL, "--data-path", *words, "--split", "90,8,2", "--train-iters", "1")
            lib.check_refused(tag, p, needles)
        lib.synth(j("shards"), 20000)
        others = [
            ("a split with no documents", ["--data-path", eod, "--split", "999,1,0"], ["valid", "split"]),
            ("--split on token shards", ["--data-path", j("shards", "train.bin"), "--split", "9,1,0"],
             ["--split", "Megatron"]),
            ("--data-path with per-split paths", ["--data-path", eod, "--valid-data-path", plain], ["does not mix"]),
            ("a seed over 2^32", ["--data-path", eod, "--seed", "5000000000"], ["--seed", "2^32"]),
            ("a --split that is not numbers", ["--data-path", eod, "--split", "90;x"], ["--split", "90;x"]),
            ("a --split giving training no share", ["--data-path", eod, "--split", "0,1,0"], ["--split", "no share"]),
            ("--split with per-split paths", ["--train-data-path", eod, "--split", "9,1,0"], ["--split", "per-split"]),
            ("per-split paths without a training one", ["--valid-data-path", eod], ["--train-data-path"]),
            ("a blend whose weights are not all numbers", ["--data-path", "0.5", eod, plain, eod],
             ["--data-path", "not numbers"]),
            ("--test-data-path on token shards", ["--data-path", j("shards", "train.bin"), "--test-data-path",
                                                  j("shards", "val.bin")], ["--test-data-path", "Megatron"]),
            ("--train-data-path beside --data-path on token shards",
             ["--data-path", j("shards", "train.bin"), "--train-data-path", j("shards", "train.bin")],
             ["--train-data-path", "one of them"]),
            ("Llama2Tokenizer without --tokenizer-model", ["--tokenizer-type", "Llama2Tokenizer"],
             ["Llama2Tokenizer", "--tokenizer-model"]),
            ("an unknown --tokenizer-type", ["--tokenizer-type", "BertWordPieceLowerCase"],
             ["BertWordPieceLowerCase", "GPT2BPETokenizer"]),
            ("GPT2BPETokenizer without --merge-file", ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                                                       j("gpt2-vocab.json")], ["--merge-file"]),
            ("HuggingFaceTokenizer without --tokenizer-model", ["--tokenizer-type", "HuggingFaceTokenizer"],
             ["--tokenizer-model"]),
            ("--vocab-file without --tokenizer-type", ["--vocab-file", j("gpt2-vocab.json")], ["--tokenizer-type"]),
            ("--tokenizer and --tokenizer-type both", ["--tokenizer", tok, "--tokenizer-type", "HuggingFaceTokenizer",
                                                       "--tokenizer-model", tok], ["twice"]),
        ]
        for tag, flags, needles in others:
            lib.check_refused(tag, lib.loom("train", *MODEL, *flags, "--train-iters", "1"), needles)

        # a dataset changed under the run: one line naming it, exit 1
        def truncate(prefix):
            os.truncate(prefix + ".bin", 100)

        def rewrite(prefix):  # the same file, new bytes: every token 0xFFFF, past the vocabulary
            with open(prefix + ".bin", "r+b") as f:
                f.write(b"\xff" * os.path.getsize(prefix + ".bin"))

        for tag, fault, want in [("truncated", truncate, "truncated"), ("rewritten", rewrite, "vocabulary")]:
            live = bad_copy(f"live-{tag}", lambda b: b)
            metrics = j(f"live-{tag}.jsonl")
            p = subprocess.Popen([LOOM, "train", *MODEL, "--data-path", live, "--split", "100,0,0", "--eval-iters",
                                  "0", "--train-iters", "100000", "--threads", "1", "--log-interval", "1",
                                  "--metrics", metrics], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=lib.ENV)
            deadline = time.time() + 60
            while time.time() < deadline and p.poll() is None and len(lib.metrics_rows(metrics)) < 5:
                time.sleep(0.02)
            fault(live)
            _, err, took = lib.finish(p, 60)
            lines = lib.error_lines(err)
            check(f"the dataset {tag} under the run: exit 1 within {took:.1f} s, one line naming it ({want})",
                  p.returncode == 1 and len(lines) == 1 and live in lines[0] and want in lines[0], err[-500:])
            if lines:
                print(f"     {lines[0]}")
    return lib.verdict()


if __name__ == "__main__":
    raise SystemExit(main())
