"""dtype conversion (src/base/dtype.h) against PyTorch, bit for bit.

Inputs, as bit patterns: all 65536 bf16 and all 65536 fp16 patterns
(-> float32), and for float32 -> bf16 / fp16 (and the round trips back) a
structured set: every exponent, both signs, with edge mantissas, random
mantissas, and the rounding cases of every width that occurs (the low d bits
just below, at and just above half way, with the lowest kept bit even and
odd; d = 16 for bf16, 13 for fp16 normals, 14..24 for fp16 subnormals); the
neighbourhoods of the thresholds (fp16 max 65504 and 65520, which rounds to
inf; bf16 max and its half-way point; the smallest normals and subnormals
of all three formats and half of them); +-0, +-inf, NaNs of both signs with
quiet, signalling and random payloads; and a million random patterns.
tests/tools/dtype_probe converts them (and checks loom's fast conversions
against its references on the way); PyTorch converts them with
`.to(torch.bfloat16)` / `.to(torch.float16)` / `.to(torch.float32)`.

PyTorch runs twice, in child processes, since the CPU kernel is chosen once
per process:
  * ATEN_CPU_CAPABILITY=default: the scalar kernels, i.e. c10::BFloat16 and
    c10::Half's own conversions. Every result must match bit for bit, NaNs
    included.
  * the machine's capability (AVX2 or AVX-512): every result must match bit
    for bit, except one NaN detail: PyTorch's vectorised float32 -> bf16
    kernel writes 0xFFFF for every NaN (torch 1.13: cvtfp32_bf16 blends in
    0xffff), where c10::BFloat16, the scalar path, and loom write the
    canonical quiet NaN 0x7FC0. There a NaN input must give a NaN, nothing
    more.
The NaN rules that do hold on both paths: float32 -> fp16 gives 0x7E00 with
the input's sign, payload dropped; bf16 -> float32 keeps every bit
(signalling NaNs stay signalling); fp16 -> float32 keeps sign and payload
and sets the quiet bit.

Run with Debian's /usr/bin/python3 (torch 1.13, numpy); BUILD names the
build folder (default build). Prints one line per check; exits 1 on any
failure.
"""
import os
import sys
import tempfile

import numpy as np

import lib

PROBE = lib.tool("dtype_probe")
SIGN = 0x80000000

# (name, output file, element type, input file): what the probe and PyTorch write.
RESULTS = [
    ("f32->bf16", "f32_to_bf16.bin", np.uint16, "f32.bin"),
    ("f32->fp16", "f32_to_f16.bin", np.uint16, "f32.bin"),
    ("bf16->f32", "bf16_to_f32.bin", np.uint32, "bf16.bin"),
    ("fp16->f32", "f16_to_f32.bin", np.uint32, "f16.bin"),
    ("f32->bf16->f32", "f32_bf16_f32.bin", np.uint32, "f32.bin"),
    ("f32->fp16->f32", "f32_f16_f32.bin", np.uint32, "f32.bin"),
]
# Outputs of the vectorised float32 -> bf16 kernel, where a NaN may be any NaN.
BF16_FROM_F32 = {"f32->bf16", "f32->bf16->f32"}


def tie_mantissas(rng, d):
    """23-bit mantissas whose low d bits sit just below, at and just above
    half way (and at 0, 1 and all ones); where the lowest kept bit (bit d) is
    a mantissa bit, with it both even and odd (for d >= 23 the implicit bit
    and the exponent decide)."""
    half = 1 << (d - 1)
    low = np.array([half - 1, half, half + 1, 0, 1, 2 * half - 1], dtype=np.uint64)
    out = [low]
    if d < 23:
        for parity in (0, 1):
            for _ in range(2):
                high = int(rng.integers(0, 1 << 23)) >> (d + 1) << (d + 1)
                out.append(high | parity << d | low)
    return np.concatenate(out) & 0x7FFFFF


def f32_patterns():
    rng = np.random.default_rng(20240611)
    edge = np.array([0, 1, 2, 0x7FFFFF, 0x7FFFFE, 0x400000, 0x3FFFFF, 0x400001], dtype=np.uint64)
    mants = [edge, rng.integers(0, 1 << 23, 256, dtype=np.uint64)]
    for d in [16, 13] + list(range(14, 25)):  # bf16; fp16 normal; fp16 subnormal (d = 14..24)
        mants.append(tie_mantissas(rng, d))
    mants = np.unique(np.concatenate(mants))
    exps = np.arange(256, dtype=np.uint64)
    grid = (exps[:, None] << 23 | mants[None, :]).reshape(-1)
    grid = grid[(grid >> 23) != 255]  # inf and NaN come below, on purpose

    anchors = [
        0x477FE000,  # 65504, fp16 max
        0x477FF000,  # 65520: half way to 65536, rounds to inf
        0x47800000,  # 65536
        0x7F7F0000,  # bf16 max
        0x7F7F8000,  # half way past bf16 max: rounds to inf
        0x7F7FFFFF,  # f32 max
        0x38800000,  # 2^-14, fp16 smallest normal
        0x33800000,  # 2^-24, fp16 smallest subnormal
        0x33000000,  # 2^-25, half of it: rounds to 0
        0x33C00000,  # 1.5 * 2^-24: a tie that rounds up to 2 * 2^-24
        0x00800000,  # f32 (and bf16) smallest normal
        0x00000001,  # f32 smallest subnormal
        0x00010000,  # bf16 smallest subnormal
        0x00008000,  # half of it
        0x00018000,  # 1.5 of it
        0x3F800000,  # 1.0
    ]
    near = np.array([a + k for a in anchors for k in range(-4, 5) if 0 <= a + k < 0x7F800000],
                    dtype=np.uint64)
    payloads = np.concatenate([
        np.array([1, 2, 0x400000, 0x400001, 0x200000, 0x7FFFFF, 0x3FFFFF, 0x1234, 0x10000, 0xFFFF],
                 dtype=np.uint64),
        rng.integers(1, 1 << 23, 64, dtype=np.uint64),
    ])
    specials = np.concatenate([
        np.array([0, 0x7F800000], dtype=np.uint64),  # 0, inf
        0x7F800000 | payloads,  # NaNs: signalling (bit 22 clear) and quiet
    ])
    positive = np.concatenate([grid, near, specials])
    both = np.concatenate([positive, positive | SIGN])
    rand = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64)
    return np.concatenate([both, rand]).astype(np.uint32)


def torch_reference(d):
    """Child process: PyTorch's results for the inputs in d, written beside
    them under the probe's names (the CPU capability is set by the parent)."""
    import torch

    def bits16(t):
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)

    def bits32(t):
        return t.contiguous().view(torch.int32).numpy().view(np.uint32)

    def load(name, dtype):
        a = np.fromfile(os.path.join(d, "..", name), dtype=dtype)
        return torch.from_numpy(a.view(np.int32 if dtype == np.uint32 else np.int16))

    x = load("f32.bin", np.uint32).view(torch.float32)
    bf = load("bf16.bin", np.uint16).view(torch.bfloat16)
    hf = load("f16.bin", np.uint16).view(torch.float16)
    out = {
        "f32_to_bf16.bin": bits16(x.to(torch.bfloat16)),
        "f32_to_f16.bin": bits16(x.to(torch.float16)),
        "bf16_to_f32.bin": bits32(bf.to(torch.float32)),
        "f16_to_f32.bin": bits32(hf.to(torch.float32)),
        "f32_bf16_f32.bin": bits32(x.to(torch.bfloat16).to(torch.float32)),
        "f32_f16_f32.bin": bits32(x.to(torch.float16).to(torch.float32)),
    }
    for name, a in out.items():
        a.tofile(os.path.join(d, name))  # little-endian host, as the probe requires
    return 0


def is_nan(bits, dtype):
    bits = bits.astype(np.uint64)
    if dtype == np.uint16:
        return (bits & 0x7FFF) > 0x7F80  # bf16 (fp16 outputs never take this path)
    return (bits & 0x7FFFFFFF) > 0x7F800000


def compare(label, name, ours, ref, inputs, nan_any):
    """Bit for bit; with nan_any, an element where PyTorch wrote a NaN only
    needs a NaN from loom. Returns 1 on failure."""
    if ours.shape != ref.shape:
        print(f"FAIL {name} [{label}]: {ours.size} results vs {ref.size}")
        return 1
    differ = ours != ref
    note = ""
    if nan_any:
        waived = differ & is_nan(ours, ours.dtype) & is_nan(ref, ref.dtype)
        differ &= ~waived
        if waived.any():
            seen = ", ".join(f"0x{int(v):x}" for v in np.unique(ref[waived])[:3])
            note = f"; {int(waived.sum())} NaNs where torch wrote {seen} (allowed here)"
    bad = np.flatnonzero(differ)
    if bad.size == 0:
        print(f"ok   {name:16s} [{label}] {ours.size} patterns bit for bit{note}")
        return 0
    print(f"FAIL {name:16s} [{label}] {bad.size} of {ours.size} patterns differ{note}")
    w = 4 if inputs.dtype == np.uint32 else 2
    wo = 2 * ours.dtype.itemsize
    for i in bad[:5]:
        print(f"       input 0x{int(inputs[i]):0{2 * w}x}: loom 0x{int(ours[i]):0{wo}x} "
              f"torch 0x{int(ref[i]):0{wo}x}")
    return 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-ref":
        return torch_reference(sys.argv[2])
    if not lib.built(PROBE):
        return 1
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        inputs = {
            "f32.bin": f32_patterns(),
            "bf16.bin": np.arange(1 << 16, dtype=np.uint32).astype(np.uint16),
            "f16.bin": np.arange(1 << 16, dtype=np.uint32).astype(np.uint16),
        }
        for name, a in inputs.items():
            a.tofile(os.path.join(d, name))
        r = lib.run([PROBE, d])
        sys.stdout.write(r.stdout)
        sys.stdout.write(r.stderr)
        if r.returncode != 0:
            print(f"FAIL dtype_probe exited {r.returncode}")
            return 1
        ours = {f: np.fromfile(os.path.join(d, f), dtype=t) for _, f, t, _ in RESULTS}

        for label, capability in (("scalar kernels", "default"), ("vectorised kernels", None)):
            sub = os.path.join(d, capability or "machine")
            os.mkdir(sub)
            env = dict(os.environ)
            env.pop("ATEN_CPU_CAPABILITY", None)
            if capability:
                env["ATEN_CPU_CAPABILITY"] = capability
            r = lib.run([sys.executable, __file__, "--torch-ref", sub], env=env)
            if r.returncode != 0:
                print(f"FAIL torch reference [{label}] exited {r.returncode}\n{r.stderr}")
                failures += 1
                continue
            for name, f, t, src in RESULTS:
                ref = np.fromfile(os.path.join(sub, f), dtype=t)
                nan_any = capability is None and name in BF16_FROM_F32
                failures += compare(label, name, ours[f], ref, inputs[src], nan_any)
    print(f"test_dtype_torch: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
