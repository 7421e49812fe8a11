"""Writer (and reader) for llm.c token shards: a header of 256 int32
(magic 20240520, version 1, token count, rest zero), then uint16 tokens."""
import numpy as np

MAGIC = 20240520
VERSION = 1


def write(path, tokens, magic=MAGIC, version=VERSION, count=None):
    """Writes tokens (values < 65536). magic, version and count can be
    overridden to produce malformed shards in tests."""
    toks = np.asarray(tokens)
    if toks.size and (toks.min() < 0 or toks.max() > 0xFFFF):
        raise ValueError("tokens must fit in uint16")
    header = np.zeros(256, dtype="<i4")
    header[0] = magic
    header[1] = version
    header[2] = toks.size if count is None else count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype("<u2").tobytes())


def read(path):
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:1024].view("<i4")
    if header[0] != MAGIC or header[1] != VERSION:
        raise ValueError(f"{path}: not a token shard")
    n = int(header[2])
    return raw[1024:1024 + 2 * n].view("<u2").astype(np.int64)
