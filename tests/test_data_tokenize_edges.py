"""`loom data tokenize --tokenizer` at its edges: nothing cut, nothing
mixed, nothing left half-made.

- A .jsonl document holding an escaped NUL (\\u0000), beside other
  escapes, a surrogate pair, and a first key whose value nests brackets and
  quotes: its tokens are those of the same text given as a .txt file (the
  whole text, not the part before the NUL).
- An OUTDIR that already holds shards: refused, exit 2 in one line naming
  it, the shards there left byte for byte (a train_*.bin glob would mix the
  two corpora).
- An empty input, or one of blank lines only: exit 2 in one line, no shard
  and no OUTDIR made; the same for `loom data train-tokenizer`.
- A run that fails on a bad line after shards were written: exit 2, and
  none of its shards left behind.
"""
import json
import os
import sys
import tempfile

import lib
from lib import check, verdict


def shard_files(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".bin")) if os.path.isdir(d) else []


def tokens(d):
    """The train shards' bytes past the 1024-byte header, concatenated."""
    out = b""
    for n in shard_files(d):
        if n.startswith("train_"):
            with open(os.path.join(d, n), "rb") as f:
                out += f.read()[1024:]
    return out


def tokenize(tok, *args):
    return lib.loom("data", "tokenize", "--tokenizer", tok, "--val-fraction", "0", "--no-progress", *args)


def one_error(p):
    errs = lib.error_lines(p.stderr)
    return p.returncode == 2 and len(errs) == 1, errs


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        P = lambda *a: os.path.join(tmp, *a)  # noqa: E731
        corpus = P("corpus.jsonl")
        with open(corpus, "w") as f:
            for i in range(200):
                f.write(json.dumps({"text": f"line {i}: zero \u0000 bytes and the quick brown fox é 😀"}) + "\n")
        p = lib.loom("data", "train-tokenizer", "--vocab-size", "320", "--no-progress", corpus, P("tok"))
        if not check("a tokenizer to test with", p.returncode == 0, p.stderr[-300:]):
            return verdict()
        tok = P("tok")

        # \u0000 inside a document: the whole text is tokenized
        docs = ["before\u0000after the NUL", "two\u0000\u0000NULs, a quote \" a backslash \\ é 😀 tab\tend",
                "\u0000", "no NUL at all"]
        with open(P("nul.jsonl"), "w") as f:
            f.write(json.dumps({"meta": {"a": [1, "}]\"{"], "b": None}, "text": docs[0]}) + "\n")
            for d in docs[1:]:
                f.write(json.dumps({"text": d}) + "\n")
        txts = []
        for i, d in enumerate(docs):
            txts.append(P(f"doc{i}.txt"))
            with open(txts[-1], "wb") as f:
                f.write(d.encode())
        p = tokenize(tok, P("nul.jsonl"), P("o_jsonl"))
        q = tokenize(tok, *txts, P("o_txt"))
        a, b = tokens(P("o_jsonl")), tokens(P("o_txt"))
        check("a .jsonl text with \\u0000: its tokens are the whole text's (as from .txt files)",
              p.returncode == 0 and q.returncode == 0 and a == b and len(a) > 0,
              f"exit {p.returncode}/{q.returncode}, {len(a) // 2} tokens vs {len(b) // 2}: {p.stderr[-200:]}")

        # an OUTDIR holding shards of an earlier run
        other = P("other.jsonl")
        with open(other, "w") as f:
            f.write(json.dumps({"text": "another corpus"}) + "\n")
        before = {n: open(P("o_txt", n), "rb").read() for n in shard_files(P("o_txt"))}
        p = tokenize(tok, other, P("o_txt"))
        ok, errs = one_error(p)
        after = {n: open(P("o_txt", n), "rb").read() for n in shard_files(P("o_txt"))}
        check("OUTDIR with shards of an earlier run: exit 2, one line naming it, its shards untouched",
              ok and P("o_txt") in errs[0] and before and after == before,
              f"exit {p.returncode}: {p.stderr[-300:]}; shards {sorted(before)} -> {sorted(after)}")

        # an empty input, and one of blank lines
        for name, text in (("empty", ""), ("blank lines", "\n  \n\r\n\n")):
            src, out = P(name.replace(" ", "_") + ".jsonl"), P("o_" + name.replace(" ", "_"))
            with open(src, "w") as f:
                f.write(text)
            p = tokenize(tok, src, out)
            ok, errs = one_error(p)
            check(f"an input that is {name}: exit 2 in one line, no OUTDIR made", ok and not os.path.exists(out),
                  f"exit {p.returncode}: {p.stderr[-300:]}; {out} exists: {os.path.exists(out)}")

        out = P("o_tok_empty")
        p = lib.loom("data", "train-tokenizer", "--vocab-size", "300", "--no-progress", P("empty.jsonl"), out)
        ok, errs = one_error(p)
        check("train-tokenizer on an empty input: exit 2 in one line, no OUTDIR made",
              ok and not os.path.exists(out), f"exit {p.returncode}: {p.stderr[-300:]}")

        # a bad line after shards were written: none of them left
        with open(P("bad.jsonl"), "w") as f:
            for i in range(50):
                f.write(json.dumps({"text": f"good document {i}"}) + "\n")
            f.write("{not json\n")
        os.mkdir(P("o_bad"))
        p = tokenize(tok, "--shard-size", "16", P("bad.jsonl"), P("o_bad"))
        ok, errs = one_error(p)
        check("a bad line after shards were written: exit 2 in one line, no shard left",
              ok and "bad.jsonl:51" in errs[0] and shard_files(P("o_bad")) == [],
              f"exit {p.returncode}: {p.stderr[-300:]}; left {shard_files(P('o_bad'))[:4]}")
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
