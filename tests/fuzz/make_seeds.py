"""Writes the committed seed corpora of the fuzz targets in tests/fuzz/:
corpus/safetensors/, a few small valid files laid out as loom's writer lays
them out (tensors by element size then name, header padded with spaces to a
multiple of 8) and a few malformed ones that reach the reader's checks;
corpus/shard/, token shards in llm.c's format, valid and malformed;
corpus/config_json/ (not written here) holds examples/configs/*.json and a
few malformed configs, among them one a fuzzer found (a newline inside a
string value made a two-line error); and
corpus/trainer_state/, trainer_state.json texts shaped as
loom_ckpt_state_format writes them (with or without a loss scaler) and a few
malformed ones; corpus/tokenizer/, tokenizer.json texts (byte-level BPE
of GPT-2's layout, Llama 3's, with added tokens and a prefix space) each
followed by a NUL and text to encode. The trainer states carry a checksum of zeros: the target
parses whatever the checksum says, and checks verification on its own
round trip. Run it from anywhere with /usr/bin/python3; the output is
deterministic.

Not here: running the fuzzers (tests/test_fuzz.py)."""
import json
import os
import struct

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
         "U8": 1, "I8": 1, "BOOL": 1}


def raw(header_text, data=b"", hsize=None):
    h = header_text.encode() if isinstance(header_text, str) else header_text
    return struct.pack("<Q", len(h) if hsize is None else hsize) + h + data


def valid(tensors, meta=None):
    """tensors: (name, dtype, shape, bytes) in any order; laid out as loom's writer does."""
    header, data = {}, b""
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, payload in sorted(tensors, key=lambda t: (-SIZES[t[1]], t[0])):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    return raw(text, data)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


seeds = {
    "valid_small": valid([("wte", "F32", [2, 3], struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)),
                          ("ln.bias", "BF16", [2], struct.pack("<2H", 0x3f80, 0xc0a0)),
                          ("ids", "U8", [3], b"\x01\x02\x03")], {"format": "pt", "step": "120"}),
    "valid_dtypes": valid([("f64", "F64", [2], struct.pack("<2d", 1 / 3, -2.5)),
                           ("i64", "I64", [1], struct.pack("<q", -5)),
                           ("u64", "U64", [1], struct.pack("<Q", 7)),
                           ("i32", "I32", [1], struct.pack("<i", -1)),
                           ("u32", "U32", [1], struct.pack("<I", 9)),
                           ("f16", "F16", [2, 1], struct.pack("<2H", 0x3c00, 0x7bff)),
                           ("i16", "I16", [1], struct.pack("<h", -3)),
                           ("u16", "U16", [1], struct.pack("<H", 65535)),
                           ("i8", "I8", [1], b"\x80"), ("bool", "BOOL", [2], b"\x01\x00"),
                           ("scalar", "F32", [], struct.pack("<f", 42)), ("empty", "F32", [4, 0, 2], b""),
                           ("dims8", "U8", [1, 1, 1, 1, 1, 1, 1, 2], b"\x05\x06")]),
    "valid_no_tensors": valid([]),
    "valid_gaps_unknown_field": raw(json.dumps({
        "__metadata__": {"note": "caf\u00e9 \\u escaped"},
        "a": dict(entry("U8", [2], 4, 6), extra=[1, {"x": None}]),
        "z": entry("F32", [0, 3], 5, 5), "s": entry("U8", [], 6, 7)}) + "    ", bytes(range(8))),
    "bad_overlap": raw(json.dumps({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}), bytes(12)),
    "bad_span_past_end": raw(json.dumps({"w": entry("F16", [4], 0, 8)}), bytes(6)),
    "bad_shape_overflow": raw(json.dumps({"w": entry("F64", [0, 4294967296, 4294967296], 0, 0)})),
    "bad_header_size": raw('{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4), hsize=1 << 40),
    "bad_utf8_name": raw(b'{"w\xc0\xaf":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00"),
}



def state(**change):
    """A trainer state as loom_ckpt_state_format lays it out, with `change` applied."""
    st = {"checksum": "0" * 16, "format": "loom-checkpoint", "version": 1, "iteration": 120,
          "consumed_samples": 3840, "optimizer": {"type": "AdamW", "step": 118}, "rng": {"seed": "1234"},
          "data": {"order": "shuffled", "global_batch_size": 32, "next_step": 121},
          "loss_scaler": {"scale": 65536, "good_steps": 17, "hysteresis": 2, "skipped_steps": 2},
          "model": {"type": "gpt2", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                    "max_position_embeddings": 128, "vocab_size": 256},
          "layout": {"world_size": 2, "data_parallel_size": 2, "tensor_model_parallel_size": 1,
                     "pipeline_model_parallel_size": 1, "zero_stage": 1},
          "files": ["rank_00000.safetensors", "rank_00001.safetensors"]}
    st.update(change)
    return json.dumps(st, indent="\t").encode() + b"\n"


states = {
    "valid_loss_scaler": state(config={"lr": 0.0006, "save": "ckpt", "seq_length": 128}),
    "valid_no_loss_scaler": state(loss_scaler=None, data={"order": "sequential", "global_batch_size": 8},
                                  files=["rank_00000.safetensors"]),
    "bad_step_after_iteration": state(optimizer={"type": "AdamW", "step": 121}),
    "bad_file_name": state(files=["rank_00000.safetensors", "../../etc/passwd"]),
    "bad_seed_number": state(rng={"seed": 1234}),
    "bad_truncated": state()[:200],
    "valid_user_model": state(model={"type": "mlp"}, loss_scaler=None),
    "bad_iteration_not_exact": state(iteration=9007199254740992),
    "valid_model_settings": state(model={"type": "gpt2", "num_layers": 2, "hidden_size": 64,
                                         "num_attention_heads": 4, "max_position_embeddings": 128,
                                         "vocab_size": 256, "norm_epsilon": 0.1, "activation_function": "gelu",
                                         "untie_embeddings_and_output_weights": 1}),
    "bad_model_shape_huge": state(model={"type": "gpt2", "num_layers": 2.5e33}),
    "bad_model_setting_word": state(model={"type": "gpt2", "activation_function": "ge\"lu"}),
    "bad_model_key_twice": state().replace(b'"hidden_size": 64', b'"num_layers": 64'),
    "valid_run_and_sizes": state(run="0123456789abcdef", files=[{"name": "rank_00000.safetensors", "bytes": 4096},
                                                                {"name": "rank_00001.safetensors", "bytes": 4096}]),
    "bad_run": state(run="XYZ"),
    "bad_file_bytes": state(files=[{"name": "rank_00000.safetensors", "bytes": -5}]),
}

def shard(tokens, magic=20240520, version=1, count=None):
    """A token shard in llm.c's format: 256 int32 of header, then uint16 tokens."""
    header = [magic, version, len(tokens) if count is None else count] + [0] * 253
    return struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)


shards = {
    "valid_small": shard([1, 2, 3, 50256, 0, 255]),
    "valid_empty": shard([]),
    "valid_bytes": shard(list(range(256)) * 2),
    "bad_magic": shard([1, 2, 3], magic=1234),
    "bad_version": shard([1, 2, 3], version=7),
    "bad_count_long": shard([1, 2, 3], count=5),
    "bad_count_negative": shard([1, 2, 3], count=-1),
    "bad_token_vocab": shard([1, 60000, 3]),
    "bad_header_short": shard([1, 2, 3])[:100],
}



def byte_chars():
    """GPT-2's bytes_to_unicode: printable Latin-1 bytes are themselves, the rest U+0100 on."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def tokenizer(merges, pre, added=(), prefix=False):
    """A tokenizer.json: the 256 bytes, then a token per merge (pairs of strings of bytes)."""
    ch = byte_chars()
    name = lambda b: "".join(ch[x] for x in b)  # noqa: E731
    vocab = {ch[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(name(a + b), len(vocab))
    if pre == "gpt2":
        pt = {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": True}
    else:
        pt = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|\s+(?!\S)|\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    toks = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": i == 1, "rstrip": False,
             "normalized": False, "special": True} for i, c in enumerate(added)]
    doc = {"version": "1.0", "added_tokens": toks, "normalizer": None, "pre_tokenizer": pt,
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                     "merges": [f"{name(a)} {name(b)}" for a, b in merges]}}
    return json.dumps(doc, ensure_ascii=False).encode()


MERGES = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"a", b"n"), (b"an", b"d"), (b" ", b"and"), (b"\n", b"\n")]
TEXT = "the cat and the dog\n\nthe end 12345 \u6570\u636e \U0001f642 it's <|endoftext|> x".encode() + b"\xff\xc3"
tokenizers = {
    "gpt2": tokenizer(MERGES, "gpt2") + b"\0" + TEXT,
    "gpt2_prefix": tokenizer(MERGES, "gpt2", prefix=True) + b"\0" + TEXT,
    "llama3": tokenizer(MERGES, "llama3") + b"\0" + TEXT,
    "added": tokenizer(MERGES, "gpt2", added=("<|endoftext|>", "<pad>")) + b"\0" + TEXT,
    "bad_merge": tokenizer(MERGES, "gpt2").replace(b'"t h"', b'"t zz"') + b"\0" + TEXT,
    "bad_json": b'{"model": {"type": "BPE", "vocab": {' + b"\0" + TEXT,
}

for sub, ext, files in (("safetensors", ".safetensors", seeds), ("trainer_state", ".json", states),
                        ("shard", ".bin", shards), ("tokenizer", ".bin", tokenizers)):
    out = os.path.join(CORPUS, sub)
    os.makedirs(out, exist_ok=True)
    for name, content in files.items():
        with open(os.path.join(out, name + ext), "wb") as f:
            f.write(content)
    print(f"wrote {len(files)} seeds to {out}")
