#!/usr/bin/env python3
"""loom's byte-level BPE against Hugging Face `tokenizers` (PyPI, tests only).

Tokenizers are trained here by `tokenizers` itself on a mixed corpus
(English, code, CJK, emoji, whitespace runs, numbers, contractions), for
three layouts: GPT-2's (ByteLevel pre-tokenizer), GPT-2's with
add_prefix_space, and Llama 3's (a Split on the cl100k-style pattern, then
ByteLevel without its regex, special tokens <|begin_of_text|> and
<|end_of_text|>). On documents that are not in the training text (the same
kinds, plus special tokens inside text and bytes that are not valid UTF-8):

- the ids loom gives equal `tokenizers`' encode(text, add_special_tokens=False),
  for every document (invalid UTF-8: `tokenizers` gets Python's
  decode(errors="replace") of the same bytes, which is what loom reads);
- decoding equals `tokenizers`' decode(ids, skip_special_tokens=False), for
  the documents' ids and for random id sequences (which cut multi-byte
  characters: U+FFFD where they do);
- GPT-2's vocab.json + merges.txt (written by `tokenizers`' model.save) give
  the same ids as the tokenizer.json;
- the tokenizer.json loom writes (bpe_tool save) loads in `tokenizers` and
  encodes every document as loom does.

All of it twice: with the `tokenizers` that transformers 4.39.3 brings
(0.15.2), and with the one users install today (TOKENIZERS_TODAY, its own
virtual environment), which also runs Llama 3's `ignore_merges` (whole
words in the vocabulary taken before any merge).
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import lib
from lib import check

TOKENIZERS_TODAY = "tokenizers==0.23.3"
TODAY_VENV = os.path.join(lib.BUILD, "test-venv-tokenizers")
if not os.environ.get("LOOM_TOKENIZERS_TODAY"):
    lib.use_transformers()  # its virtual environment holds `tokenizers`
import tokenizers  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

TOOL = lib.tool("bpe_tool")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus(seed, n):
    """n documents (str) mixing the kinds of text users bring."""
    rng = random.Random(seed)
    here = os.path.dirname(os.path.abspath(__file__))
    code = [open(os.path.join(here, f), encoding="utf-8").read() for f in sorted(os.listdir(here)) if f.endswith(".py")]
    prose = open(os.path.join(here, "..", "docs", "DESIGN.md"), encoding="utf-8").read().split("\n\n")
    cjk = ["数据并行训练的模型", "東京は日本の首都です。", "한국어 텍스트와 숫자 12345", "中文，标点；符号！"]
    emoji = ["🙂", "🚀🚀", "👩‍💻", "🇫🇷", "❤️", "✨ sparkle"]
    extra = ["I'M HERE, you're there; they'LL see.", "  \t  leading and trailing  ", "x = 1_000_000 + 3.14159e-10",
             "line\r\nwindows\r\n\r\n", "tabs\t\tand\u00a0nbsp\u2003em space", "a" * 300, " " * 70 + "end",
             "Ünïcödé çàfé naïve", "\n\n\n", "1234567890123", "'s's 't've"]
    docs = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 5)):
            k = rng.random()
            if k < 0.35:
                c = rng.choice(code)
                i = rng.randrange(len(c))
                parts.append(c[i:i + rng.randint(20, 400)])
            elif k < 0.65:
                parts.append(rng.choice(prose)[:rng.randint(20, 600)])
            elif k < 0.8:
                parts.append(rng.choice(cjk))
            elif k < 0.9:
                parts.append(rng.choice(emoji))
            else:
                parts.append(rng.choice(extra))
        docs.append(rng.choice(["", " ", "\n"]).join(parts))
    return docs


def train_hf(kind, docs, path):
    tok = Tokenizer(models.BPE())
    if kind == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=kind == "gpt2-prefix")
        specials = ["<|endoftext|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.save(path)
    return tok, specials


def loom_encode(tokenizer, texts):
    """texts: bytes each (may be invalid UTF-8) -> loom's ids."""
    lines = b"".join(json.dumps(t.decode("utf-8", "surrogateescape"), ensure_ascii=False)
                     .encode("utf-8", "surrogateescape") + b"\n" for t in texts)
    p = subprocess.run([TOOL, "encode", tokenizer], input=lines, capture_output=True, timeout=300)
    if p.returncode:
        raise SystemExit(f"bpe_tool encode {tokenizer}: {p.stderr.decode()[-400:]}")
    return [json.loads(l) for l in p.stdout.decode().split("\n") if l]  # not splitlines: U+2028 is text


def loom_decode(tokenizer, id_lists):
    p = subprocess.run([TOOL, "decode", tokenizer], input="".join(json.dumps(i) + "\n" for i in id_lists),
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise SystemExit(f"bpe_tool decode {tokenizer}: {p.stderr[-400:]}")
    return [json.loads(l) for l in p.stdout.split("\n") if l]  # not splitlines: U+0085, U+2028 are text


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"document {i}: loom {str(x)[:200]} vs tokenizers {str(y)[:200]}"
    return f"{len(a)} vs {len(b)} documents"


def invalid_utf8(rng, n):
    """n byte strings with invalid UTF-8 among valid text."""
    bad = [b"\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80\x80", b"\xf5\x80"]
    out = []
    for _ in range(n):
        parts = [rng.choice(["caf\u00e9 ", "data ", "数据", "🙂", " x", "\n"]).encode() for _ in range(rng.randint(1, 6))]
        for _ in range(rng.randint(1, 3)):
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(bad))
        out.append(b"".join(parts))
    return out


def compare(kind, tmp):
    train_docs, test_docs = corpus(1, 400), corpus(2, 150)
    path = os.path.join(tmp, kind + ".json")
    tok, specials = train_hf(kind, train_docs, path)
    rng = random.Random(3)
    # special tokens inside text, glued to words and spaced
    with_specials = [f"{d[:50]}{rng.choice(specials)}{d[50:100]} {rng.choice(specials)} x" for d in test_docs[:40]]
    texts = [d.encode() for d in test_docs + with_specials] + invalid_utf8(rng, 40)
    want = [tok.encode(t.decode("utf-8", "replace"), add_special_tokens=False).ids for t in texts]
    got = loom_encode(path, texts)
    check(f"{kind}: loom's ids equal tokenizers' for {len(texts)} documents "
          f"({sum(map(len, want))} tokens; English, code, CJK, emoji, special tokens, invalid UTF-8)",
          got == want, first_difference(got, want))
    vocab = tok.get_vocab_size()
    random_ids = [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(200)]
    lists = want + random_ids
    want_text = [tok.decode(i, skip_special_tokens=False) for i in lists]
    got_text = loom_decode(path, lists)
    check(f"{kind}: decoded text equals tokenizers' for the documents and 200 random id lists",
          got_text == want_text, first_difference(got_text, want_text))
    # loom's own tokenizer.json, read back by tokenizers
    out = os.path.join(tmp, kind + "-saved")
    os.makedirs(out)
    p = subprocess.run([TOOL, "save", path, out], capture_output=True, text=True)
    back = Tokenizer.from_file(os.path.join(out, "tokenizer.json")) if p.returncode == 0 else None
    again = [back.encode(t.decode("utf-8", "replace"), add_special_tokens=False).ids for t in texts] if back else []
    check(f"{kind}: tokenizers loads the tokenizer.json loom writes and encodes every document as loom does",
          again == got, p.stderr[-300:] or first_difference(again, got))
    if kind == "gpt2":
        d = os.path.join(tmp, "gpt2-files")
        os.makedirs(d)
        tok.model.save(d)  # vocab.json + merges.txt, GPT-2's own layout
        files = loom_encode(d, texts)
        check("gpt2: vocab.json + merges.txt give the same ids as tokenizer.json", files == want,
              first_difference(files, want))


def ignore_merges(tmp):
    """Llama 3's files set ignore_merges: a piece that is a vocabulary token is
    taken whole, even where the merges would not make it."""
    tok, _ = train_hf("llama3", corpus(1, 200), os.path.join(tmp, "im-base.json"))
    doc = json.loads(tok.to_str())
    doc["model"]["ignore_merges"] = True
    vocab = doc["model"]["vocab"]
    for w in ("Ġtokenizer", "Ġparallelism", "Ġcheckpoint", "Ġmerges"):  # whole words no merge reaches
        vocab.setdefault(w, len(vocab))
    path = os.path.join(tmp, "im.json")
    json.dump(doc, open(path, "w"))
    hf = Tokenizer.from_file(path)
    texts = ["the tokenizer and parallelism checkpoint merges"] + corpus(9, 40)
    want = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    got = loom_encode(path, [t.encode() for t in texts])
    check("llama3 with ignore_merges: loom's ids equal tokenizers' (whole-word tokens taken before merging)",
          got == want and any(vocab["Ġtokenizer"] in w for w in want), first_difference(got, want))


def main():
    if not lib.built(TOOL):
        return 1
    print(f"tokenizers {tokenizers.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("gpt2", "gpt2-prefix", "llama3"):
            compare(kind, tmp)
        if hasattr(models.BPE(), "ignore_merges"):
            ignore_merges(tmp)
    if not os.environ.get("LOOM_TOKENIZERS_TODAY"):  # again with today's tokenizers
        py = lib.venv_python(TODAY_VENV, TOKENIZERS_TODAY, "tokenizers")
        p = subprocess.run([py, os.path.abspath(__file__)], capture_output=True, text=True,
                           env=dict(os.environ, LOOM_TOKENIZERS_TODAY="1"), timeout=600)
        print(p.stdout, end="")
        check(f"the same with {TOKENIZERS_TODAY} (exit {p.returncode})", p.returncode == 0, p.stderr[-400:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
