#!/usr/bin/env python3
"""loom's SentencePiece tokenizers against `sentencepiece` and `tokenizers`
(PyPI, tests only).

Two SentencePiece BPE models are trained here by `sentencepiece` itself on a
mixed corpus: Llama 2's settings (byte fallback, identity normalization,
split digits, a leading space added; <unk> <s> </s> at 0, 1, 2) and Gemma's
(no leading space; <pad> <eos> <bos> <unk> at 0-3 and two user-defined
tokens). transformers 4.39.3's converters (LlamaTokenizerFast,
GemmaTokenizerFast) write each as the tokenizer.json those models ship
(a Prepend + Replace normalizer, or Replace alone; BPE over characters with
byte fallback; the Replace/ByteFallback/Fuse/Strip decoder), and a third
file is Mistral's form of the first (no normalizer, a Metaspace
pre-tokenizer with prepend_scheme first, the Metaspace decoder). On
held-out documents (English, code, CJK, emoji, whitespace runs, special
tokens inside text, invalid UTF-8):

- tokenizer.model (through libsentencepiece): loom's ids equal
  `sentencepiece`'s encode of the same bytes; decoding equals its decode;
- each tokenizer.json: loom's ids equal `tokenizers`' encode(text,
  add_special_tokens=False) (invalid UTF-8: of Python's decode(errors=
  "replace"), which loom reads); decoding equals its decode(ids,
  skip_special_tokens=False) for the documents and 200 random id lists;
- `loom data tokenize` shards hold each document as transformers'
  tokenizer(text).input_ids gives it (the template's <s> first) from the
  tokenizer.model and from the tokenizer.json; Megatron's format with
  --tokenizer-type Llama2Tokenizer puts <s> first, SentencePieceTokenizer
  not (as Megatron's own tokenizers of those names);
- in use: a Llama trains on those shards with --tokenizer tokenizer.model;
  the checkpoint holds the model (recorded in its trainer state); `loom
  convert --to hf` writes a directory that AutoTokenizer (the fast
  tokenizer transformers converts from it) loads and that encodes every
  document as `sentencepiece` does after <s>, and AutoModelForCausalLM.
  generate on it gives `loom sample`'s greedy text;
- refused in one line, exit 2: a file that is not a SentencePiece model, a
  tokenizer.json with a normalizer loom does not run (NFKC), a Replace by
  Regex, Megatron's tokenizer type without --tokenizer-model.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import lib
from lib import LOOM, check

lib.use_sentencepiece()  # its virtual environment holds sentencepiece, tokenizers, transformers
import sentencepiece as spm  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import test_tokenizer_hf as th  # noqa: E402

TOOL = lib.tool("bpe_tool")
COMMON = dict(vocab_size=1000, model_type="bpe", byte_fallback=True, character_coverage=0.9995,
              split_digits=True, allow_whitespace_only_pieces=True, normalization_rule_name="identity",
              remove_extra_whitespaces=False, num_threads=1, minloglevel=2)


def train_models(tmp, docs):
    """Llama 2's and Gemma's settings; each model's tokenizer.json by
    transformers' converter, and Mistral's Metaspace form of Llama's."""
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(line for d in docs for line in d.splitlines() if line.strip()))
    from transformers import GemmaTokenizerFast, LlamaTokenizerFast
    out = {}
    for name, kw, fast in [("llama", dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True),
                            LlamaTokenizerFast),
                           ("gemma", dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, add_dummy_prefix=False,
                                          user_defined_symbols=["<start_of_turn>", "<end_of_turn>"]),
                            GemmaTokenizerFast)]:
        d = os.path.join(tmp, name)
        os.makedirs(d)
        spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(d, "tokenizer"), **kw, **COMMON)
        jd = os.path.join(tmp, name + "-json")
        fast(vocab_file=os.path.join(d, "tokenizer.model"), legacy=True).save_pretrained(jd)
        out[name] = (os.path.join(d, "tokenizer.model"), os.path.join(jd, "tokenizer.json"))
    doc = json.load(open(out["llama"][1], encoding="utf-8"))
    doc["normalizer"] = None
    doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True,
                            "prepend_scheme": "first"}
    for tag in ("metaspace", "metaspace-decoder"):  # Llama's decoder (Mistral's files), then Metaspace's own
        if tag == "metaspace-decoder":
            doc["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True,
                              "prepend_scheme": "first"}
        path = os.path.join(tmp, tag + ".json")
        json.dump(doc, open(path, "w", encoding="utf-8"), ensure_ascii=False)
        out[tag] = (None, path)
    return out


def texts_for(rng, test_docs, specials):
    with_specials = [f"{d[:50]}{rng.choice(specials)}{d[50:100]} {rng.choice(specials)} x" for d in test_docs[:40]]
    extra = ["", " ", "  two leading", "trailing  ", "a\n\n\nb", "\t\ttabs", "x" * 400 + " y", "12345 67.89"]
    return [d.encode() for d in test_docs + with_specials + extra] + th.invalid_utf8(rng, 40)


def check_model(name, model, texts, rng):
    sp = spm.SentencePieceProcessor(model_file=model)
    want = [sp.encode(t) for t in texts]
    got = th.loom_encode(model, texts)
    check(f"{name} tokenizer.model: loom's ids equal sentencepiece's for {len(texts)} documents "
          f"({sum(map(len, want))} tokens; English, code, CJK, emoji, special tokens, invalid UTF-8)",
          got == want, th.first_difference(got, want))
    lists = want + [[rng.randrange(sp.get_piece_size()) for _ in range(rng.randint(1, 40))] for _ in range(200)]
    want_text = [sp.decode(i) for i in lists]
    got_text = th.loom_decode(model, lists)
    check(f"{name} tokenizer.model: decoded text equals sentencepiece's for the documents and 200 random id lists",
          got_text == want_text, th.first_difference(got_text, want_text))


def check_json(name, path, texts, rng):
    tok = Tokenizer.from_file(path)
    want = [tok.encode(t.decode("utf-8", "replace"), add_special_tokens=False).ids for t in texts]
    got = th.loom_encode(path, texts)
    check(f"{name} tokenizer.json: loom's ids equal tokenizers' for {len(texts)} documents "
          f"({sum(map(len, want))} tokens)", got == want, th.first_difference(got, want))
    lists = want + [[rng.randrange(tok.get_vocab_size()) for _ in range(rng.randint(1, 40))] for _ in range(200)]
    want_text = [tok.decode(i, skip_special_tokens=False) for i in lists]
    got_text = th.loom_decode(path, lists)
    check(f"{name} tokenizer.json: decoded text equals tokenizers' for the documents and 200 random id lists",
          got_text == want_text, th.first_difference(got_text, want_text))


SPECIALS = ("<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>")


def plain(docs):
    """docs without special tokens' text: sentencepiece reads "<s>" in text as
    text, a fast tokenizer as the token (the corpus holds this file)."""
    out = []
    for d in docs:
        for t in SPECIALS:
            d = d.replace(t, "")
        out.append(d)
    return out


def read_shards(d):
    import test_data_prepare as dp
    return [i for prefix in ("train", "val") for i in dp.shards(d, prefix)[1]]


def data_tokenize(tmp, files, docs):
    """Shards and Megatron's files from the tokenizer.model and tokenizer.json."""
    from transformers import AutoTokenizer
    jl = os.path.join(tmp, "docs.jsonl")
    with open(jl, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    model, js = files["llama"]
    at = AutoTokenizer.from_pretrained(os.path.dirname(js))
    sp = spm.SentencePieceProcessor(model_file=model)
    # each file's own reference: sentencepiece reads "<s>" in text as text, tokenizers as the token
    for tag, tok, want in (("tokenizer.model", model, [i for d in docs for i in [sp.bos_id()] + sp.encode(d)]),
                           ("tokenizer.json", js, [i for d in docs for i in at(d).input_ids])):
        out = os.path.join(tmp, "shards-" + tag)
        p = lib.loom("data", "tokenize", "--tokenizer", tok, jl, out, "--val-fraction", "0", "--no-progress")
        got = read_shards(out) if p.returncode == 0 else []
        ref = "sentencepiece's ids after <s>" if tag == "tokenizer.model" else "tokenizer(text).input_ids"
        check(f"loom data tokenize with the {tag}: the shards hold {ref} for every document ({len(want)} tokens)",
              got == want, p.stderr[-300:] or th.first_difference(got, want))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy as np
    for ttype, bos in (("Llama2Tokenizer", True), ("SentencePieceTokenizer", False)):
        prefix = os.path.join(tmp, "meg-" + ttype)
        p = lib.loom("data", "tokenize", "--tokenizer-type", ttype, "--tokenizer-model", model, "--input", jl,
                     "--output-prefix", prefix, "--output-format", "megatron", "--append-eod", "--no-progress")
        want_docs = [([sp.bos_id()] if bos else []) + sp.encode(d) + [sp.eos_id()] for d in docs]
        got_docs = read_megatron(prefix + "_text_document", np) if p.returncode == 0 else []
        check(f"Megatron's format with --tokenizer-type {ttype}: {'<s>, ' if bos else ''}sentencepiece's ids and "
              f"</s> a document", got_docs == want_docs, p.stderr[-300:] or th.first_difference(got_docs, want_docs))
    return os.path.join(tmp, "shards-tokenizer.model")


def read_megatron(prefix, np):
    """The documents of an MMIDIDX .bin/.idx (one sequence a document)."""
    idx = open(prefix + ".idx", "rb").read()
    dtype = {8: np.uint16, 4: np.int32}[idx[17]]
    n = int(np.frombuffer(idx, np.int64, 1, 18)[0])
    sizes = np.frombuffer(idx, np.int32, n, 34)
    ptrs = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    data = open(prefix + ".bin", "rb").read()
    return [np.frombuffer(data, dtype, int(s), int(p)).astype(int).tolist() for s, p in zip(sizes, ptrs)]


def in_use(tmp, files, shards, docs):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = files["llama"][0]
    save, hf = os.path.join(tmp, "save"), os.path.join(tmp, "hf")
    shape = ["--model", "llama-tiny", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "32",
             "--max-position-embeddings", "32", "--vocab-size", "1000"]
    p = lib.loom("train", *shape, "--data-path", os.path.join(shards, "train_*.bin"), "--train-iters", "30",
                 "--eval-iters", "0", "--micro-batch-size", "2", "--global-batch-size", "2", "--tokenizer", model,
                 "--save", save, "--threads", "1", timeout=600)
    state = {}
    for root, _, names in os.walk(save):
        if "trainer_state.json" in names:
            state = json.load(open(os.path.join(root, "trainer_state.json")))
    rec = state.get("tokenizer") or {}
    check("in use: a Llama trains on the shards with --tokenizer tokenizer.model; the checkpoint holds it, "
          "recorded in the trainer state", p.returncode == 0 and rec.get("name") == "tokenizer.model" and
          rec.get("bytes") == os.path.getsize(model), p.stderr[-300:] or str(rec))
    q = lib.loom("convert", save, hf, "--to", "hf") if p.returncode == 0 else p
    if not check("in use: loom convert --to hf copies the tokenizer.model", q.returncode == 0 and
                 os.path.exists(os.path.join(hf, "tokenizer.model")), q.stderr[-300:]):
        return
    at = AutoTokenizer.from_pretrained(hf)
    sp = spm.SentencePieceProcessor(model_file=model)
    want = [[sp.bos_id()] + sp.encode(d) for d in docs]
    got = [at(d).input_ids for d in docs]
    check(f"in use: AutoTokenizer ({type(at).__name__}) on the exported directory encodes every document as "
          f"sentencepiece after <s>", got == want, th.first_difference(got, want))
    prompt = "The data layer"
    r = subprocess.run([LOOM, "sample", "--load", hf, "--prompt", prompt, "--max-new-tokens", "20",
                        "--temperature", "0", "--threads", "1"], capture_output=True, timeout=300)
    m = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    m.generation_config.eos_token_id = None
    ids = at(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=at.eos_token_id)
    theirs = at.decode(out[0].tolist(), skip_special_tokens=True)
    ours = r.stdout.decode("utf-8", "replace")
    ours = ours[:-1] if ours.endswith("\n") else ours
    check(f"in use: AutoModelForCausalLM.generate on the directory gives loom sample's greedy text "
          f"(<s> {at.bos_token_id} first, config bos {m.config.bos_token_id})",
          r.returncode == 0 and theirs == ours and m.config.bos_token_id == sp.bos_id(),
          f"loom {ours!r}\ntransformers {theirs!r}\n{r.stderr[-300:]}")


def gemma_export(tmp, files, shards, docs):
    """Gemma's settings (no leading space, <pad> at 0): the exported directory
    names the padding token, and AutoTokenizer encodes as sentencepiece."""
    from transformers import AutoTokenizer
    model = files["gemma"][0]
    save, hf = os.path.join(tmp, "save-gemma"), os.path.join(tmp, "hf-gemma")
    shape = ["--model", "llama-tiny", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4",
             "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "32",
             "--max-position-embeddings", "32", "--vocab-size", "1000"]
    p = lib.loom("train", *shape, "--data-path", os.path.join(shards, "train_*.bin"), "--train-iters", "2",
                 "--eval-iters", "0", "--micro-batch-size", "1", "--global-batch-size", "1", "--tokenizer", model,
                 "--save", save, "--threads", "1", timeout=600)
    q = lib.loom("convert", save, hf, "--to", "hf") if p.returncode == 0 else p
    if not check("Gemma's settings: trained with its tokenizer.model and exported", q.returncode == 0, q.stderr[-300:]):
        return
    sp = spm.SentencePieceProcessor(model_file=model)
    cfg = json.load(open(os.path.join(hf, "config.json")))
    at = AutoTokenizer.from_pretrained(hf)
    want = [[sp.bos_id()] + sp.encode(d) for d in docs]
    got = [at(d).input_ids for d in docs]
    ids = (cfg.get("bos_token_id"), cfg.get("eos_token_id"), cfg.get("pad_token_id"), at.pad_token_id)
    check(f"Gemma's settings: config.json's bos/eos/pad and AutoTokenizer's pad {ids} are the model's "
          f"({sp.bos_id()}, {sp.eos_id()}, {sp.pad_id()}); AutoTokenizer encodes every document as sentencepiece "
          f"after <bos>", ids == (sp.bos_id(), sp.eos_id(), sp.pad_id(), sp.pad_id()) and got == want,
          th.first_difference(got, want))


def refusals(tmp, files):
    bad = os.path.join(tmp, "bad.model")
    with open(bad, "wb") as f:
        f.write(b"\x0a\x05garbage that is not a model")
    doc = json.load(open(files["llama"][1], encoding="utf-8"))
    nfkc = dict(doc, normalizer={"type": "NFKC"})
    regex = dict(doc, normalizer={"type": "Replace", "pattern": {"Regex": " +"}, "content": "\u2581"})
    cases = []
    for tag, d in (("nfkc", nfkc), ("regex", regex)):
        path = os.path.join(tmp, tag + ".json")
        json.dump(d, open(path, "w", encoding="utf-8"), ensure_ascii=False)
        cases.append((tag, path))
    jl = os.path.join(tmp, "one.jsonl")
    open(jl, "w").write('{"text": "x"}\n')
    for tag, tok, needle in [("not a model", bad, "not a SentencePiece model"),
                             ("NFKC", cases[0][1], 'normalizer "NFKC" is not supported'),
                             ("Regex Replace", cases[1][1], "Regex pattern is not supported")]:
        p = lib.loom("data", "tokenize", "--tokenizer", tok, jl, os.path.join(tmp, "out-" + tag), "--no-progress")
        lib.check_refused(f"refused: {tag}", p, [needle])
    p = lib.loom("data", "tokenize", "--tokenizer-type", "Llama2Tokenizer", "--input", jl, "--output-prefix",
                 os.path.join(tmp, "x"), "--output-format", "megatron")
    lib.check_refused("refused: Llama2Tokenizer without --tokenizer-model", p, ["needs --tokenizer-model"])


def main():
    if not (lib.built(LOOM) and lib.built(TOOL)):
        return 1
    print(f"sentencepiece {spm.__version__}")
    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as tmp:
        files = train_models(tmp, th.corpus(1, 400))
        test_docs = th.corpus(2, 150)
        for name in ("llama", "gemma"):
            specials = ["<s>", "</s>", "<unk>"] if name == "llama" else ["<bos>", "<eos>", "<start_of_turn>"]
            texts = texts_for(rng, test_docs, specials)
            check_model(name, files[name][0], texts, rng)
            check_json(name, files[name][1], texts, rng)
        texts = texts_for(rng, test_docs, ["<s>", "</s>"])
        check_json("Mistral's form (Metaspace pre-tokenizer)", files["metaspace"][1], texts, rng)
        check_json("Metaspace decoder", files["metaspace-decoder"][1], texts, rng)
        docs = th.corpus(3, 60)
        shards = data_tokenize(tmp, files, docs)
        in_use(tmp, files, shards, plain(docs[:30]))
        gemma_export(tmp, files, shards, plain(docs[:30]))
        refusals(tmp, files)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
