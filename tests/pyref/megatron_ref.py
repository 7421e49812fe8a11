"""Megatron-Core's own dataset code (PyPI `megatron-core`, CPU, tests only),
driven from a JSON job: run by tests/test_megatron_data.py under its
virtual environment's Python as `python3 megatron_ref.py JOB.json OUT.json`.

megatron.core's package __init__ imports the whole training stack (CUDA-era
torch APIs); its datasets need only numpy, torch's tensors and the compiled
helpers, so the two package modules are stood in by bare namespaces (and
log_single_rank by a logger call) and the dataset modules are imported
directly. Nothing of Megatron's behaviour is replaced.

Jobs (a list; each result in order):
  {"op": "preprocess", "tokenizer": T, "input": JSONL, "key": K, "prefix": P,
   "append_eod": bool}
      what tools/preprocess_data.py does for one key without sentence
      splitting (its Encoder.encode and IndexedDatasetBuilder): each
      document's ids from `tokenizers`, the end-of-text appended to a
      non-empty one when asked, an empty document kept as an empty entry,
      uint16 below 65,500 ids else int32; writes P.bin and P.idx.
  {"op": "read", "prefix": P}          the documents IndexedDataset reads.
  {"op": "random", "prefix": P, "docs": N, "vocab": V, "seed": S,
   "eod": E, "max_len": L}            a dataset of random documents (some
                                       empty), written by IndexedDatasetBuilder.
  {"op": "samples", "seed": S, "seq_length": T, "blend": [words] | null,
   "blend_per_split": [[words] | null] * 3 | null, "split": str | null,
   "sizes": [train, valid, test], "count": [n, n, n]}
      BlendedMegatronDatasetBuilder(GPTDataset, sizes, ...).build(): each
      split's length and its first n samples' T + 1 tokens.
"""
import json
import logging
import os
import site
import sys
import types

base = next(p for p in site.getsitepackages() + [site.getusersitepackages()]
            if os.path.isdir(os.path.join(p, "megatron", "core", "datasets")))
for name in ("megatron", "megatron.core"):
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(base, *name.split("."))]
    sys.modules[name] = m
utils = types.ModuleType("megatron.core.utils")
utils.log_single_rank = lambda logger, *args, rank=0, **kw: logger.log(*args, **kw)
sys.modules["megatron.core.utils"] = utils
logging.disable(logging.WARNING)

import numpy  # noqa: E402
import torch.distributed  # noqa: E402

torch.distributed.get_rank = lambda *a, **k: 0  # one process: what an uninitialised group would say
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder  # noqa: E402
from megatron.core.datasets.utils import get_blend_from_list  # noqa: E402


class Tokenizer:
    """What GPTDataset asks of a tokenizer: the end of document and the pad."""
    eod = 0
    pad = -1
    vocab_size = None  # read only for per-dataset sequence files, not used here
    unique_identifiers = {"class": "Tokenizer"}


def preprocess(job):
    from tokenizers import Tokenizer as HF

    tok = HF.from_file(job["tokenizer"])
    eod = tok.token_to_id("<|endoftext|>")
    builder = IndexedDatasetBuilder(job["prefix"] + ".bin",
                                    dtype=DType.optimal_dtype(tok.get_vocab_size(with_added_tokens=True)))
    with open(job["input"], encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)[job["key"]]
            ids = tok.encode(text).ids
            lens = [len(ids)] if ids else []
            if ids and job["append_eod"]:
                ids.append(eod)
                lens[-1] += 1
            builder.add_document(ids, lens)
    builder.finalize(job["prefix"] + ".idx")
    return None


def read(job):
    d = IndexedDataset(job["prefix"])
    docs = d.document_indices
    return [[int(t) for s in range(docs[i], docs[i + 1]) for t in d[s]] for i in range(len(docs) - 1)]


def random_dataset(job):
    rng = numpy.random.RandomState(job["seed"])
    b = IndexedDatasetBuilder(job["prefix"] + ".bin", dtype=DType.optimal_dtype(job["vocab"]))
    for _ in range(job["docs"]):
        n = int(rng.randint(0, job["max_len"]))
        ids = list(rng.randint(1, job["vocab"], size=n)) + ([job["eod"]] if n else [])
        b.add_document(ids, [len(ids)] if ids else [])
    b.finalize(job["prefix"] + ".idx")
    return None


def samples(job):
    cfg = GPTDatasetConfig(
        tokenizer=Tokenizer(), reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        random_seed=job["seed"], sequence_length=job["seq_length"],
        blend=get_blend_from_list(job["blend"]),
        blend_per_split=[get_blend_from_list(b) for b in job["blend_per_split"]] if job["blend_per_split"] else None,
        split=job["split"], path_to_cache=job["cache"])
    out = []
    for d, n in zip(BlendedMegatronDatasetBuilder(GPTDataset, job["sizes"], lambda: True, cfg).build(), job["count"]):
        if d is None:
            out.append(None)
            continue
        rows = []
        for i in range(min(n, len(d))):
            s = d[i]
            rows.append([int(t) for t in s["tokens"].tolist()] + [int(s["labels"][-1])])
        out.append({"size": len(d), "rows": rows})
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    ops = {"preprocess": preprocess, "read": read, "random": random_dataset, "samples": samples}
    results = [ops[j["op"]](j) for j in jobs]
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
