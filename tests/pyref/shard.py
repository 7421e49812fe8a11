"""Writer (and reader) for llm.c token shards: a header of 256 int32
(magic 20240520, version, token count, rest zero), then the tokens: uint16
for version 1, uint32 for version 2 (llm.c's Llama 3 shards)."""
import numpy as np

MAGIC = 20240520
VERSION = 1
VERSION_32 = 2


def write(path, tokens, magic=MAGIC, version=VERSION, count=None):
    """Writes tokens (values < 65536). magic, version and count can be
    overridden to produce malformed shards in tests."""
    toks = np.asarray(tokens)
    top = 0xFFFFFFFF if version == VERSION_32 else 0xFFFF
    if toks.size and (toks.min() < 0 or toks.max() > top):
        raise ValueError(f"tokens must fit in {'uint32' if version == VERSION_32 else 'uint16'}")
    header = np.zeros(256, dtype="<i4")
    header[0] = magic
    header[1] = version
    header[2] = toks.size if count is None else count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype("<u4" if version == VERSION_32 else "<u2").tobytes())


def read(path):
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:1024].view("<i4")
    if header[0] != MAGIC or header[1] not in (VERSION, VERSION_32):
        raise ValueError(f"{path}: not a token shard")
    n, w = int(header[2]), 4 if header[1] == VERSION_32 else 2
    return raw[1024:1024 + w * n].view("<u4" if w == 4 else "<u2").astype(np.int64)
