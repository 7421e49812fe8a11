"""Minimal safetensors reader and writer (json + numpy), from the format spec.

Layout: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}
(padded with spaces so the data starts at a multiple of 8), then the raw
little-endian tensor data; offsets are relative to the start of the data.
"""
import json
import struct

import numpy as np

DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
}
NAMES = {v: k for k, v in DTYPES.items()}


def save(path, tensors, metadata=None, header_override=None):
    """Writes {name: array}. header_override(name, entry) may alter an entry
    (to write deliberately inconsistent files in tests)."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr)
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        if dt not in NAMES:
            raise ValueError(f"{name}: unsupported dtype {a.dtype}")
        b = a.astype(dt, copy=False).tobytes()
        entry = {"dtype": NAMES[dt], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        if header_override:
            entry = header_override(name, entry)
        header[name] = entry
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - (8 + len(hj)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def load(path, with_metadata=False):
    """Returns {name: numpy array} (and the metadata dict if asked)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n].decode())
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, e in header.items():
        dt = DTYPES[e["dtype"]]
        b, end = e["data_offsets"]
        shape = tuple(e["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - b != count * dt.itemsize or end > len(data) or b < 0:
            raise ValueError(f"{path}: tensor {name} has inconsistent offsets")
        out[name] = np.frombuffer(data[b:end], dtype=dt).reshape(shape).copy()
    return (out, meta) if with_metadata else out
