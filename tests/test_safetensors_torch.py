"""Interoperability of loom's safetensors reader and writer.

Checks loom against a minimal reader and writer written here from the format
description (json + numpy), in both directions, through build/tests/tools/
st_tool:
  - a file written by loom is read here: the layout the official reader
    demands (padded header, contiguous spans from 0 to the end of the file),
    aligned data, and every value;
  - files written here (spaces padding, awkward unaligned order, metadata,
    every dtype) are read by loom's st_tool dump, compared by hash and sum;
  - a malformed file written here is refused with a message naming it.

Not here: the official safetensors package (not a dependency), malformed
files in detail (test_safetensors.c).
"""
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np

import lib

TOOL = lib.tool("st_tool")

DTYPES = {  # safetensors dtype -> numpy dtype (BF16 kept as its raw bits)
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
FLOATS = ("F32", "F16", "BF16", "F64")

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL", what, file=sys.stderr)


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key in header")
    return dict(pairs)


def read_st(path):
    """A minimal reader from the format description; returns (meta, {name:
    (dtype, shape, array, offsets)}, header length, raw header text)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    text = raw[8:8 + n].decode("utf-8")
    header = json.loads(text, object_pairs_hook=no_duplicates)
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    tensors = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        tensors[name] = (e["dtype"], list(e["shape"]), arr, (begin, end))
    return meta, tensors, n, text, len(data)


def write_st(path, tensors, meta=None, pad=True):
    """A minimal writer: tensors is a list of (name, dtype, shape, bytes) in
    data order; the header is padded with spaces to a multiple of 8."""
    header = {}
    if meta is not None:
        header["__metadata__"] = meta
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode("utf-8")  # ", " and ": " separators: spaces inside
    if pad:
        text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, data in tensors:
            f.write(data)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def as_f32(dtype, arr):
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def f32_sum(dtype, arr):
    s = 0.0
    for v in as_f32(dtype, arr).ravel():
        s += float(v)
    return s


def dump(path):
    r = lib.run([TOOL, "dump", path])
    meta, tensors = {}, {}
    for line in r.stdout.splitlines():
        parts = line.split(" ")
        if parts[0] == "meta":
            meta[parts[1]] = " ".join(parts[2:])
        elif parts[0] == "tensor":
            name, dtype, shape, nbytes, h, s = parts[1:]
            dims = [int(d) for d in shape.strip("[]").split(",") if d]
            tensors[name] = (dtype, dims, int(nbytes), int(h, 16), None if s == "-" else float(s))
    return r.returncode, r.stderr, meta, tensors


def expected_loom_file():
    """What st_tool write puts in its file (the formulas of st_tool.c)."""
    return {
        "f32.weight": ("F32", [3, 5], (np.arange(15, dtype=np.float32) - 7) * np.float32(0.25)),
        "f64": ("F64", [4], np.arange(4) / 3.0),
        "f16": ("F16", [2, 3], np.array([1, -2, 65504, 2.0**-24, -0.0, 0.333251953125], np.float16)),
        "bf16": ("BF16", [4], np.array([0x3F80, 0xC060, 0x3E20, 0x7F80], np.uint16)),
        "i32": ("I32", [2, 2], np.array([-1, 2**31 - 1, -(2**31), 12345], np.int32)),
        "i64": ("I64", [3], np.array([-(2**63), -1, 2**40], np.int64)),
        "u8": ("U8", [5], np.arange(5, dtype=np.uint8) * 60),
        "i8": ("I8", [4], np.array([-128, -1, 0, 127], np.int8)),
        "u16": ("U16", [3], np.array([0, 1000, 65535], np.uint16)),
        "i16": ("I16", [3], np.array([-32768, 5, 32767], np.int16)),
        "bool": ("BOOL", [2, 2], np.array([True, False, False, True])),
        "u32": ("U32", [2], np.array([0, 2**32 - 1], np.uint32)),
        "u64": ("U64", [1], np.array([2**64 - 1], np.uint64)),
        "scalar": ("F32", [], np.array(3.5, np.float32)),
        "empty": ("F32", [0, 4], np.zeros((0, 4), np.float32)),
    }


def test_loom_writes(tmp):
    path = os.path.join(tmp, "loom.safetensors")
    r = lib.run([TOOL, "write", path])
    check(r.returncode == 0, "st_tool write: " + r.stderr)
    check(not [f for f in os.listdir(tmp) if ".tmp." in f], "temporary file left behind")
    meta, tensors, n, text, data_len = read_st(path)

    check(n % 8 == 0, f"header size {n} is not a multiple of 8")
    body = text.rstrip(" ")
    check(body.endswith("}") and len(text) - len(body) < 8, "header padding is not spaces")
    check(meta == {"format": "pt", "producer": "loom st_tool", "unicode": "\u00e9 \u2713"},
          f"metadata {meta}")

    # the layout the official reader insists on: spans contiguous from 0 to the end
    spans = sorted(t[3] for t in tensors.values())
    pos = 0
    for b, e in spans:
        check(b == pos, f"span [{b}, {e}) does not start at {pos}")
        pos = e
    check(pos == data_len, f"spans end at {pos}, data area is {data_len} bytes")

    want = expected_loom_file()
    check(set(tensors) == set(want), f"tensor names {sorted(tensors)}")
    for name, (dtype, shape, arr) in want.items():
        if name not in tensors:
            continue
        gdtype, gshape, garr, (b, e) = tensors[name]
        check(gdtype == dtype, f"{name}: dtype {gdtype}, want {dtype}")
        check(gshape == shape, f"{name}: shape {gshape}, want {shape}")
        check((8 + n + b) % np.dtype(DTYPES[dtype]).itemsize == 0, f"{name}: data not aligned")
        arr = arr.reshape(shape)
        ok = garr.shape == arr.shape and garr.tobytes() == arr.astype(DTYPES[dtype]).tobytes()
        check(ok, f"{name}: values {garr.ravel()[:8]} want {arr.ravel()[:8]}")
    if "bf16" in tensors:
        f = as_f32("BF16", tensors["bf16"][2])
        check(list(f) == [1.0, -3.5, 0.15625, math.inf], f"bf16 as float32: {f}")

    # loom reads back its own file and agrees with this reader
    rc, err, dmeta, dtensors = dump(path)
    check(rc == 0, "st_tool dump: " + err)
    check(dmeta == meta, f"dump metadata {dmeta}")
    check(list(dtensors) == sorted(dtensors), "dump is not in name order")
    for name, (dtype, shape, arr, _) in tensors.items():
        compare_dump(name, dtype, shape, arr, dtensors.get(name))


def compare_dump(name, dtype, shape, arr, got):
    if got is None:
        check(False, f"{name}: missing from st_tool dump")
        return
    gdtype, gshape, nbytes, h, s = got
    raw = arr.tobytes()
    check(gdtype == dtype and gshape == list(shape), f"{name}: dump {gdtype} {gshape}")
    check(nbytes == len(raw), f"{name}: dump {nbytes} bytes, want {len(raw)}")
    check(h == fnv1a64(raw), f"{name}: dump hash differs")
    if dtype in FLOATS:
        want = f32_sum(dtype, arr)
        check(s == want or (math.isnan(s) and math.isnan(want)), f"{name}: dump sum {s}, want {want}")
    else:
        check(s is None, f"{name}: sum for an integer dtype")


def test_python_writes(tmp):
    rng = np.random.default_rng(1234)
    f32 = rng.standard_normal((4, 3)).astype(np.float32)
    bf16 = (rng.standard_normal(6).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    arrays = [  # an odd first tensor, so every later one sits unaligned
        ("tiny.u8", "U8", np.array([7, 8, 9], np.uint8)),
        ("w.f32", "F32", f32),
        ("w.f16", "F16", rng.standard_normal((2, 5)).astype(np.float16)),
        ("w.bf16", "BF16", bf16.reshape(2, 3)),
        ("w.f64", "F64", rng.standard_normal(5)),
        ("ids.i64", "I64", np.array([-(2**62), 3, 2**62], np.int64)),
        ("ids.i32", "I32", np.array([[1, -2], [3, -4]], np.int32)),
        ("mask", "BOOL", np.array([True, False, True])),
        ("i8", "I8", np.array([-5, 5], np.int8)),
        ("i16", "I16", np.array([-300, 300, 7], np.int16)),
        ("u16", "U16", np.array([60000, 1], np.uint16)),
        ("scalar.f64", "F64", np.array(2.5)),
        ("none", "F16", np.zeros((3, 0), np.float16)),
    ]
    tensors = [(n, d, list(a.shape), a.astype(DTYPES[d]).tobytes()) for n, d, a in arrays]
    meta = {"format": "pt", "step": "17", "note": "spaces in values"}
    path = os.path.join(tmp, "py.safetensors")
    write_st(path, tensors, meta)
    rc, err, dmeta, dtensors = dump(path)
    check(rc == 0, "st_tool dump of a Python file: " + err)
    check(dmeta == meta, f"dump metadata {dmeta}")
    check(set(dtensors) == {a[0] for a in arrays}, f"dump names {sorted(dtensors)}")
    for name, dtype, arr in arrays:
        compare_dump(name, dtype, arr.shape, arr.astype(DTYPES[dtype]), dtensors.get(name))

    # no metadata, no padding (any header length is valid)
    path2 = os.path.join(tmp, "py_nopad.safetensors")
    write_st(path2, tensors[:2], None, pad=False)
    rc, err, dmeta, dtensors = dump(path2)
    check(rc == 0 and dmeta == {} and set(dtensors) == {"tiny.u8", "w.f32"},
          "unpadded file without metadata: " + err)

    # a malformed file is refused, naming the file and the tensor
    bad = os.path.join(tmp, "bad.safetensors")
    with open(bad, "wb") as f:
        text = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
        f.write(struct.pack("<Q", len(text)) + text + bytes(12))
    rc, err, _, _ = dump(bad)
    check(rc == 2 and bad in err and "'a'" in err and "'b'" in err, f"bad file: rc {rc}, {err!r}")


def main():
    if not lib.built(TOOL):
        return 1
    with tempfile.TemporaryDirectory(prefix="loom_st_py_") as tmp:
        test_loom_writes(tmp)
        test_python_writes(tmp)
    print(f"test_safetensors_torch: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
