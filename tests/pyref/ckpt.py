"""An independent reader of loom checkpoints (numpy), from the format's
description in src/io/checkpoint.h: a checkpoint directory holds
trainer_state.json and one safetensors file per rank; each stored tensor is a
piece of the full tensor of its name, described by metadata
loom.slice.<name> = {"shape": full, "view": dims, "box": [[start, stop], ...], "range": [lo, hi]}
(absent: the piece is the whole tensor; "view", when present, is the full
shape regrouped, row-major, and the box is cut in it: a tensor-parallel
rank's q, k and v columns of c_attn [C, 3C] are the box [:, :, part] of the
view [C, 3, C]). assemble() rebuilds every full tensor and checks that its
pieces cover it exactly once.
"""
import json
import os

import numpy as np

from . import st


def checkpoint_dir(path):
    """A save directory (follows latest) or a checkpoint directory."""
    if os.path.exists(os.path.join(path, "trainer_state.json")):
        return path
    with open(os.path.join(path, "latest")) as f:
        return os.path.join(path, f.read().strip())


def state(path):
    with open(os.path.join(checkpoint_dir(path), "trainer_state.json")) as f:
        return json.load(f)


def assemble(path):
    """{name: full numpy array} of a checkpoint (save directory or iter dir)."""
    d = checkpoint_dir(path)
    full, covered = {}, {}
    for entry in state(d)["files"]:
        fname = entry["name"] if isinstance(entry, dict) else entry  # {"name", "bytes"}, or a name
        tensors, meta = st.load(os.path.join(d, fname), with_metadata=True)
        for name, piece in tensors.items():
            sl = meta.get("loom.slice." + name)
            if sl is None:
                spec = {"shape": list(piece.shape), "box": [[0, n] for n in piece.shape], "range": [0, piece.size]}
            else:
                spec = json.loads(sl)
            shape = tuple(spec["shape"])
            if name not in full:
                full[name] = np.zeros(shape, np.float32)
                covered[name] = np.zeros(shape, np.int32)
            assert full[name].shape == shape, f"{name}: pieces disagree on the shape"
            dims = tuple(spec.get("view", shape))
            assert int(np.prod(dims)) == int(np.prod(shape)), f"{name}: view {dims} is not a regrouping of {shape}"
            target, ctarget = full[name].reshape(dims), covered[name].reshape(dims)  # views of the arrays
            box = tuple(slice(a, b) for a, b in spec["box"])
            lo, hi = spec["range"]
            view = target[box].reshape(-1)  # a copy when the box is not contiguous
            cview = ctarget[box].reshape(-1)
            view[lo:hi] = piece.reshape(-1)
            cview[lo:hi] += 1
            target[box] = view.reshape(target[box].shape)
            ctarget[box] = cview.reshape(ctarget[box].shape)
    for name, c in covered.items():
        assert (c == 1).all(), f"{name}: pieces cover some elements {c.min()}..{c.max()} times"
    return full


def weights(path):
    """The model's tensors of a checkpoint: assemble() without the optimizer state."""
    return {k: v for k, v in assemble(path).items() if not k.startswith("optimizer.")}
