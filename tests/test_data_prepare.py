#!/usr/bin/env python3
"""`loom data train-tokenizer` and `loom data tokenize --tokenizer`, against
Hugging Face `tokenizers` (PyPI, tests only).

- loom learns a tokenizer (GPT-2's pattern, and Llama 3's) on a mixed
  corpus; `tokenizers` loads the tokenizer.json loom wrote and encodes
  every held-out document exactly as loom does;
- `loom data tokenize --tokenizer` of .jsonl and .txt files (one document a
  file, and a document a blank-line block) writes llm.c shards holding, for
  every document in order, the end-of-text token then `tokenizers`' ids of
  it; --val-fraction sends every 1/f-th document to val_*.bin, --shard-size
  cuts the stream into shards of that many tokens; the output is the same
  with 1 and 2 threads;
- in use: `loom train --tokenizer` on those shards saves the tokenizer in
  every checkpoint (the same bytes), refuses a tokenizer with more ids than
  the model's vocabulary (exit 2, naming both); `loom sample` encodes the
  prompt and decodes with the checkpoint's tokenizer (the same text as with
  --tokenizer; the prompt's text first; valid UTF-8); `loom convert` to a
  Hugging Face directory copies it there and `tokenizers` loads it, and
  `loom sample --load` of that directory decodes with it (the same text);
  GPT-2, Llama and Mistral directories exported with it load in
  transformers' AutoTokenizer, and AutoModelForCausalLM.generate (greedy,
  20 tokens) gives loom sample's greedy text, with the tokenizer's end of
  text as the config's;
- bad input, each one line and exit 2: a missing tokenizer, one that is not
  JSON, one whose merge names a token not in the vocabulary, a .jsonl line
  that is not JSON (file and line number), a missing text key, an unknown
  flag;
- 32-bit ids: a 128,256-id tokenizer (Llama 3's size, its end of text the
  last id) gives llm.c's version 2 shards (uint32) holding `tokenizers`'
  ids; a Llama of that vocabulary trains on them (with validation), is
  evaluated, and samples with the tokenizer.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import lib
from lib import ENV, LOOM, check

lib.use_transformers()  # its virtual environment holds `tokenizers`
from tokenizers import Tokenizer  # noqa: E402
import test_tokenizer_hf as th  # noqa: E402


def read_shard(path, version=1):
    """A shard's ids: version 1 (uint16) or, asked for, 2 (uint32)."""
    with open(path, "rb") as f:
        head = struct.unpack("<256i", f.read(1024))
        assert head[0] == 20240520 and head[1] == version, path
        data = f.read()
    return list(struct.unpack(f"<{head[2]}{'I' if version == 2 else 'H'}", data))


def shards(d, prefix):
    names = sorted(n for n in os.listdir(d) if n.startswith(prefix + "_"))
    return names, [t for n in names for t in read_shard(os.path.join(d, n))]


def write_jsonl(path, docs, key="text"):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({key: d, "id": 1}, ensure_ascii=False) + "\n")


def train(tmp, docs):
    corpus = os.path.join(tmp, "corpus.jsonl")
    write_jsonl(corpus, docs)
    held_out = th.corpus(5, 120)
    for pattern in ("gpt2", "llama3"):
        out = os.path.join(tmp, "tok-" + pattern)
        p = lib.loom("data", "train-tokenizer", "--vocab-size", "1200", "--pattern", pattern, corpus, out)
        ok = p.returncode == 0 and os.path.exists(os.path.join(out, "tokenizer.json"))
        check(f"train-tokenizer --pattern {pattern}: exit 0 and a tokenizer.json ({p.stdout.strip()})", ok,
              p.stderr[-300:])
        if not ok:
            continue
        hf = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        want = [hf.encode(d, add_special_tokens=False).ids for d in held_out]
        got = th.loom_encode(out, [d.encode() for d in held_out])
        check(f"train-tokenizer --pattern {pattern}: tokenizers loads it and encodes {len(held_out)} held-out "
              f"documents as loom does ({sum(map(len, got))} tokens, {hf.get_vocab_size()} ids)",
              got == want and len(want) > 0, th.first_difference(got, want))
        merges = len(json.load(open(os.path.join(out, "tokenizer.json")))["model"]["merges"])
        check(f"train-tokenizer --pattern {pattern}: the vocabulary is the size asked (1200 = {hf.get_vocab_size()}), "
              f"{merges} merges", hf.get_vocab_size() == 1200 and merges > 800)


def tokenize(tmp, docs):
    tok_path = os.path.join(tmp, "hf.json")
    hf, _ = th.train_hf("gpt2", th.corpus(1, 300), tok_path)
    eot = hf.token_to_id("<|endoftext|>")
    ids = [hf.encode(d, add_special_tokens=False).ids for d in docs]
    jl = os.path.join(tmp, "docs.jsonl")
    write_jsonl(jl, docs, key="content")
    for threads in ("1", "2"):
        out = os.path.join(tmp, "shards-" + threads)
        p = lib.run([LOOM, "data", "tokenize", "--tokenizer", tok_path, jl, out, "--text-key", "content",
                     "--val-fraction", "0.1", "--shard-size", "5000"], env=dict(ENV, OMP_NUM_THREADS=threads))
        train_names, train_tokens = shards(out, "train")
        val_names, val_tokens = shards(out, "val")
        want_val = [t for k, i in enumerate(ids) if int((k + 1) * 0.1) > int(k * 0.1) for t in [eot] + i]
        want_train = [t for k, i in enumerate(ids) if not int((k + 1) * 0.1) > int(k * 0.1) for t in [eot] + i]
        check(f".jsonl, {threads} thread(s): exit 0; train shards hold end-of-text + tokenizers' ids of every "
              f"document not sent to validation, in order ({len(train_tokens)} tokens)",
              p.returncode == 0 and train_tokens == want_train, p.stderr[-300:] or th.first_difference(
                  train_tokens, want_train))
        check(f".jsonl, {threads} thread(s): every 10th document in val shards ({len(val_tokens)} tokens)",
              val_tokens == want_val and len(val_tokens) > 0)
        sizes = [len(read_shard(os.path.join(out, n))) for n in train_names]
        check(f".jsonl, {threads} thread(s): --shard-size 5000 cuts train into {len(sizes)} shards of 5000 but the last",
              len(sizes) > 1 and all(s == 5000 for s in sizes[:-1]) and 0 < sizes[-1] <= 5000, str(sizes))
        if threads == "2":
            same = all(open(os.path.join(out, n), "rb").read() == open(os.path.join(tmp, "shards-1", n), "rb").read()
                       for n in train_names + val_names)
            check("the shards of 1 and 2 threads are the same bytes", same)
    # text files: one document a file, and a document a blank-line block
    t1, t2 = os.path.join(tmp, "a.txt"), os.path.join(tmp, "b.txt")
    open(t1, "w", encoding="utf-8").write(docs[0])
    open(t2, "w", encoding="utf-8").write(docs[1])
    out = os.path.join(tmp, "txt")
    p = lib.loom("data", "tokenize", "--tokenizer", tok_path, t1, t2, out, "--val-fraction", "0")
    _, got = shards(out, "train")
    check(".txt, a document a file: end-of-text + ids of each file", p.returncode == 0 and
          got == [eot] + ids[0] + [eot] + ids[1], p.stderr[-300:])
    blocks = ["first block\nstill first", "second  block", "third\n\n\n"]
    t3 = os.path.join(tmp, "c.txt")
    open(t3, "w").write("\n\n".join(blocks))
    out = os.path.join(tmp, "blocks")
    p = lib.loom("data", "tokenize", "--tokenizer", tok_path, t3, out, "--val-fraction", "0", "--blank-line-docs")
    _, got = shards(out, "train")
    want = [t for b in ["first block\nstill first", "second  block", "third"] for t in
            [eot] + hf.encode(b, add_special_tokens=False).ids]
    check(".txt --blank-line-docs: a document a block between blank lines", p.returncode == 0 and got == want,
          p.stderr[-300:] + str(got[:20]))
    return tok_path, jl


def bad_input(tmp, tok_path, jl):
    def refused(what, args, *needles):
        p = lib.loom(*args)
        lines = lib.error_lines(p.stderr)
        check(f"{what}: exit 2, one line naming it", p.returncode == 2 and len(lines) == 1 and
              all(n in lines[0] for n in needles), p.stderr[-300:])

    out = os.path.join(tmp, "bad-out")
    refused("a missing tokenizer", ["data", "tokenize", "--tokenizer", os.path.join(tmp, "nope"), jl, out], "nope")
    notjson = os.path.join(tmp, "notjson.json")
    open(notjson, "w").write("{ not json")
    refused("a tokenizer that is not JSON", ["data", "tokenize", "--tokenizer", notjson, jl, out], "notjson.json",
            "not valid JSON")
    doc = json.load(open(tok_path))
    doc["model"]["merges"][3] = "Ġzzqq Ġqqzz"
    badmerge = os.path.join(tmp, "badmerge.json")
    json.dump(doc, open(badmerge, "w"))
    refused("a merge naming a token not in the vocabulary", ["data", "tokenize", "--tokenizer", badmerge, jl, out],
            "badmerge.json", "merge 4")
    doc = json.load(open(tok_path))
    doc["added_tokens"].append({"id": 900000, "content": "<|far|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    sparse = os.path.join(tmp, "sparse.json")
    json.dump(doc, open(sparse, "w"))
    refused("a vocabulary whose ids go far beyond its size", ["data", "tokenize", "--tokenizer", sparse, jl, out],
            "sparse.json", "900000")
    broken = os.path.join(tmp, "broken.jsonl")
    open(broken, "w").write('{"text": "fine"}\n{"text": "also fine"}\n{"text": "cut\n')
    refused("a .jsonl line that is not JSON", ["data", "tokenize", "--tokenizer", tok_path, broken, out],
            "broken.jsonl:3", "not a JSON object")
    nokey = os.path.join(tmp, "nokey.jsonl")
    open(nokey, "w").write('{"text": "fine"}\n{"body": "no text key"}\n')
    refused("a .jsonl line without the text key", ["data", "tokenize", "--tokenizer", tok_path, nokey, out],
            "nokey.jsonl:2", '"text"')
    refused("train-tokenizer: a .jsonl line without the text key",
            ["data", "train-tokenizer", "--vocab-size", "500", nokey, out], "nokey.jsonl:2")
    refused("train-tokenizer: --vocab-size below the bytes", ["data", "train-tokenizer", "--vocab-size", "200", jl,
                                                              out], "--vocab-size")
    refused("an unknown flag", ["data", "tokenize", "--tokenizer", tok_path, jl, out, "--shard-sise", "5"],
            "--shard-sise")


def in_use(tmp, docs):
    corpus = os.path.join(tmp, "use.jsonl")
    write_jsonl(corpus, docs)
    tok = os.path.join(tmp, "use-tok")
    p = lib.loom("data", "train-tokenizer", "--vocab-size", "320", corpus, tok)
    q = lib.loom("data", "tokenize", "--tokenizer", tok, corpus, os.path.join(tmp, "use-data"), "--no-progress")
    check("in use: a 320-id tokenizer and its shards", p.returncode == 0 and q.returncode == 0,
          p.stderr[-300:] + q.stderr[-300:])
    model = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32"]
    save = os.path.join(tmp, "use-save")
    args = ["train", *model, "--vocab-size", "320", "--data-path", os.path.join(tmp, "use-data", "train_*.bin"),
            "--train-iters", "30", "--eval-iters", "0", "--save", save, "--save-interval", "15", "--threads", "1"]
    p = lib.loom(*args, "--tokenizer", tok)
    saved = sorted(d for d in os.listdir(save) if d.startswith("iter_")) if os.path.isdir(save) else []
    same = saved and all(open(os.path.join(save, d, "tokenizer.json"), "rb").read() ==
                         open(os.path.join(tok, "tokenizer.json"), "rb").read() for d in saved)
    check(f"in use: loom train --tokenizer saves it in every checkpoint ({', '.join(saved)}), the same bytes",
          p.returncode == 0 and len(saved) == 2 and same, p.stderr[-300:])
    p = lib.loom(*[a if a != "320" else "300" for a in args], "--tokenizer", tok)
    lines = lib.error_lines(p.stderr)
    check("in use: a tokenizer of 320 ids for a vocabulary of 300 is exit 2, one line naming both",
          p.returncode == 2 and len(lines) == 1 and "320" in lines[0] and "300" in lines[0], p.stderr[-300:])
    p = lib.loom(*args, "--tokenizer", os.path.join(tmp, "no-such-tokenizer"))
    lines = lib.error_lines(p.stderr)
    check("in use: loom train --tokenizer of a missing path is exit 2, one line naming it",
          p.returncode == 2 and len(lines) == 1 and "no-such-tokenizer" in lines[0] and "--tokenizer" in lines[0],
          p.stderr[-300:])
    prompt = "The data layer"
    sample = ["sample", "--load", save, *model, "--vocab-size", "320", "--prompt", prompt, "--max-new-tokens", "30",
              "--temperature", "0.8", "--seed", "1"]
    p = subprocess.run([LOOM, *sample], capture_output=True)
    q = subprocess.run([LOOM, *sample, "--tokenizer", tok], capture_output=True)
    out = p.stdout.decode("utf-8", "strict") if p.returncode == 0 else ""
    check("in use: loom sample decodes with the checkpoint's tokenizer: the prompt's text, then text "
          f"(valid UTF-8), as with --tokenizer: {out.strip()[:60]!r}",
          p.returncode == 0 and out.startswith(prompt) and out[len(prompt):].strip() and p.stdout == q.stdout and
          b"no tokenizer" not in p.stderr, p.stderr[-300:])
    hf = os.path.join(tmp, "use-hf")
    p = lib.loom("convert", save, hf, "--to", "hf")
    path = os.path.join(hf, "tokenizer.json")
    loaded = os.path.exists(path) and Tokenizer.from_file(path).get_vocab_size() == 320
    check("in use: loom convert to a Hugging Face directory copies the tokenizer, and tokenizers loads it",
          p.returncode == 0 and loaded, p.stderr[-300:])
    r = subprocess.run([LOOM, "sample", "--load", hf, *sample[3:]], capture_output=True)
    check("in use: loom sample --load of that directory decodes with its tokenizer.json: the checkpoint's text",
          r.returncode == 0 and q.returncode == 0 and r.stdout == q.stdout and b"no tokenizer" not in r.stderr,
          r.stderr[-300:])


def wide_vocabulary(tmp, tok_dir, docs):
    """Llama 3's 128,256 ids (the test's tokenizer padded with tokens no
    merge makes, the end of text moved to the last id, as far from 16 bits as
    it gets): loom data tokenize writes 32-bit shards (llm.c's version 2)
    whose ids are tokenizers', and a model of that vocabulary trains, is
    evaluated and samples on them with the tokenizer."""
    doc = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
    vocab = doc["model"]["vocab"]
    first, V = len(vocab), 128256
    for i in range(V - first - 1):  # tokens no merge makes
        vocab[f"zz{i}"] = first + i
    eot = doc["added_tokens"][0]
    old = eot["id"]
    eot["id"] = V - 1  # the end of text past 16 bits: every document begins with it
    for k, v in list(vocab.items()):
        if v == old:
            vocab[k] = V - 1
    vocab[f"zz{V}"] = old
    d = os.path.join(tmp, "wide-tok")
    os.makedirs(d, exist_ok=True)
    json.dump(doc, open(os.path.join(d, "tokenizer.json"), "w"))
    corpus = os.path.join(tmp, "wide.jsonl")
    write_jsonl(corpus, docs)
    out = os.path.join(tmp, "wide-data")
    p = lib.loom("data", "tokenize", "--tokenizer", d, corpus, out, "--val-fraction", "0.1", "--no-progress")
    t = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    want = [i for x in docs for i in [V - 1] + t.encode(x, add_special_tokens=False).ids]
    try:
        names = sorted(n for n in os.listdir(out) if n.startswith("train_") or n.startswith("val_"))
        got = {n: read_shard(os.path.join(out, n), version=2) for n in names}
    except (OSError, AssertionError, struct.error):
        got = {}
    train = [i for n in sorted(got) if n.startswith("train_") for i in got[n]]
    val = [i for n in sorted(got) if n.startswith("val_") for i in got[n]]
    check(f"128,256 ids: loom data tokenize writes 32-bit shards (version 2) holding tokenizers' ids "
          f"({len(train) + len(val)} tokens, the largest {max(train + val, default=0)})",
          p.returncode == 0 and sorted(train + val) == sorted(want) and max(train) == V - 1, p.stderr[-300:])
    save = os.path.join(tmp, "wide-save")
    model = ["--model", "llama-tiny", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "32",
             "--max-position-embeddings", "32", "--vocab-size", str(V)]
    p = lib.loom("train", *model, "--data-path", os.path.join(out, "train_*.bin"), "--valid-data-path",
                 os.path.join(out, "val_*.bin"), "--train-iters", "6", "--eval-iters", "1", "--eval-interval", "6",
                 "--micro-batch-size", "2", "--global-batch-size", "2", "--tokenizer", d, "--save", save,
                 "--threads", "1", timeout=600)
    check("128,256 ids: a Llama trains on the 32-bit shards with the tokenizer, validation loss and all",
          p.returncode == 0 and "val loss" in p.stdout, p.stderr[-300:])
    q = lib.loom("eval", "--load", save, "--valid-data-path", os.path.join(out, "val_*.bin"), "--eval-iters", "1",
                 "--micro-batch-size", "2", "--global-batch-size", "2", "--threads", "1", timeout=600)
    r = subprocess.run([LOOM, "sample", "--load", save, "--prompt", "The data layer", "--max-new-tokens", "8",
                        "--temperature", "0", "--threads", "1"], capture_output=True, timeout=600)
    check("128,256 ids: loom eval scores the 32-bit validation shards and loom sample decodes with the tokenizer",
          q.returncode == 0 and "val loss" in q.stdout and r.returncode == 0 and
          r.stdout.startswith(b"The data layer") and b"no tokenizer" not in r.stderr,
          (q.stderr + r.stderr.decode("utf-8", "replace"))[-400:])


def generate_check(tmp, tok, tag, model):
    """An exported directory in transformers: AutoTokenizer and
    AutoModelForCausalLM.generate (greedy, 20 tokens, not stopping at the
    end of text, as loom sample does not) give loom sample's greedy text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save, hf = os.path.join(tmp, f"gen-{tag}"), os.path.join(tmp, f"gen-{tag}-hf")
    p = lib.loom("train", *model, "--vocab-size", "320", "--data-path", os.path.join(tmp, "use-data", "train_*.bin"),
                 "--train-iters", "30", "--eval-iters", "0", "--save", save, "--threads", "1", "--tokenizer", tok)
    q = lib.loom("convert", save, hf, "--to", "hf") if p.returncode == 0 else p
    if not check(f"{tag}: trained with the tokenizer and exported", q.returncode == 0, q.stderr[-300:]):
        return
    prompt = "The data layer"
    r = subprocess.run([LOOM, "sample", "--load", hf, *model, "--vocab-size", "320", "--prompt", prompt,
                        "--max-new-tokens", "20", "--temperature", "0", "--threads", "1"], capture_output=True)
    at = AutoTokenizer.from_pretrained(hf)
    m = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    m.generation_config.eos_token_id = None
    ids = at(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=at.eos_token_id)
    theirs = at.decode(out[0].tolist())
    ours = r.stdout.decode("utf-8", "replace")
    ours = ours[:-1] if ours.endswith("\n") else ours  # loom sample ends its text with a line feed
    check(f"{tag}: AutoTokenizer + generate on the exported directory give loom sample's greedy text "
          f"({len(out[0]) - len(ids[0])} tokens; eos {at.eos_token_id}, config {m.config.eos_token_id})",
          r.returncode == 0 and theirs == ours and at.eos_token_id == m.config.eos_token_id is not None,
          f"loom {ours!r}\ntransformers {theirs!r}\n{r.stderr[-300:]}")


def main():
    if not lib.built(LOOM):
        return 1
    docs = th.corpus(4, 300)
    with tempfile.TemporaryDirectory() as tmp:
        train(tmp, th.corpus(1, 400))
        tok_path, jl = tokenize(tmp, docs)
        bad_input(tmp, tok_path, jl)
        in_use(tmp, docs)
        small = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
                 "--max-position-embeddings", "32"]
        generate_check(tmp, os.path.join(tmp, "use-tok"), "gpt2", small)
        wide_vocabulary(tmp, os.path.join(tmp, "use-tok"), docs)
        for fam in ("llama", "mistral"):
            generate_check(tmp, os.path.join(tmp, "use-tok"), fam,
                           ["--model", f"{fam}-tiny", "--num-query-groups", "2", "--ffn-hidden-size", "64"] + small)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
