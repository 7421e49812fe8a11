"""Mixture of experts: the Mixtral family against Hugging Face transformers
(PyPI transformers 4.39.3 in the test-only virtual environment
lib.hf_python makes, on Debian's torch), Megatron's balancing losses
against a reference written here, layouts against one process, and the
refusals.

1. Mixtral from a Hugging Face directory: a small random MixtralForCausalLM
   (2 layers of 64 channels, top 2 of 4 experts, and top 2 of 8; every
   weight moved from its initialisation, the norms' too) saved by
   save_pretrained. $BUILD/tests/tools/hf_logits gives the logits of random
   tokens: within 1e-5 of transformers' float64 forward of the same float32
   weights (loom's float32 sums of at most 4 C terms; a wrong routing
   weight, expert or order moves them by 1e-3 or more). `loom convert`
   writes a directory whose tensors are the source's bit for bit, which
   transformers loads with no missing or unexpected keys.
2. 20 training steps of `loom train --load DIR` (accumulation 2, clipping,
   warmup + cosine) give PyTorch's per-step losses within 1e-5 relative
   (two float32 implementations summing in other orders drift ~1e-7 over 20
   steps; a routing decision that flips is a jump of ~1e-3). transformers'
   own loss has no balancing loss here (output_router_logits false, its
   default), nor has loom's (--moe-aux-loss-coeff 0).
3. Megatron's balancing losses: --moe-aux-loss-coeff 0.01 and
   --moe-z-loss-coeff 0.001 on the same run against the reference that adds,
   per MoE layer and micro-batch of N tokens, the Switch loss
   coeff E / (N^2 k) sum_e P_e f_e (P_e the softmax's sum over the tokens,
   f_e the tokens routed to e; f carries no gradient) and the z-loss
   coeff mean(logsumexp(logits)^2), to the gradient only (the reported
   loss is the language model's, as Megatron's MoEAuxLossAutoScaler does).
   Within 1e-5; without them the losses differ by more than 1e-4. The
   metrics' load_balancing_loss and z_loss, and with
   --moe-per-layer-logging each layer's, are the reference's terms within
   1e-5, and TensorBoard has Megatron's per-layer tags.
4. An independent reference written here (Megatron's routing as its
   documentation states it: shared experts, capacity factors with both drop
   policies, padding, pre-softmax top 1) in a transformers Llama whose MLPs
   it replaces, from the weights loom initialised: 20 steps within 1e-5,
   each capacity case dropping choices; and with Megatron's list form
   --moe-layer-freq "[0,1]" (the first layer's MLP dense, the reference's
   too).
5. Layouts (mixtral-tiny cut to 4 layers of 64 channels on the built-in
   corpus): DDP 2, ZeRO-3 on 2 ranks and PP 2 give one process's per-step
   losses and final weights within lib.compare_runs' 1e-5; full
   recomputation gives the same bits; under --layout-invariant 2 the three
   and TP 2 + SP give one process's bits; Llama with shared experts in every
   other layer and GPT-2's dense experts under DDP 2. In bf16 (DDP 2,
   ZeRO-3, PP 2) and fp16 (DDP 2) at lr 0: every step's loss within 1e-5
   and gradient norm within 2e-3 (lib.same_steps_at_lr0 says why not
   trained); bf16 full recomputation the same bits, trained. The list form
   of --moe-layer-freq: "([1]+[0])*2" gives 2's bits; "[0]+[1]*3" under
   PP 2 is one process's, and its checkpoint resumes without the flag.
6. Bad settings: one line, exit 2.
"""
import json
import math
import os
import sys
import tempfile

import lib
from lib import check

lib.use_transformers()
import transformers  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM  # noqa: E402

from pyref import shard, st, train  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(2)

TOOL = lib.tool("hf_logits")
V, T, B = 256, 16, 2
LOGIT_TOL, STEP_TOL = 1e-5, 1e-5


def hf_model(experts, seed):
    torch.manual_seed(seed)
    cfg = MixtralConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        num_local_experts=experts, num_experts_per_tok=2, rms_norm_eps=1e-5,
                        attn_implementation="eager")
    model = MixtralForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.05 if p.ndim == 2 else 0.3))
    return model


def forward(model, ids, router=False):
    """The body and the head called directly (forward casts the logits);
    with router, each layer's router logits too."""
    out = model.model(input_ids=ids, output_router_logits=router)
    logits = model.lm_head(out.last_hidden_state)
    return (logits, out.router_logits) if router else logits


def logits_check(tag, model, d, tmp):
    rows = np.random.default_rng(1).integers(0, V, size=(B, T + 1), dtype=np.int32)
    tpath, out = os.path.join(tmp, f"{tag}.i32"), os.path.join(tmp, f"{tag}-logits.safetensors")
    rows.tofile(tpath)
    p = lib.run([TOOL, d, tpath, out, str(B), str(T)])
    if p.returncode != 0:
        return check(f"{tag}: hf_logits runs", False, p.stderr[-500:])
    ref = type(model)(model.config).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            want = forward(ref, torch.tensor(rows[:, :T], dtype=torch.long)).numpy()
    finally:
        torch.set_default_dtype(torch.float32)
    got = st.load(out)["logits"]
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    check(f"{tag}: logits of a random model, max |loom - transformers (float64)| {diff:.1e} "
          f"(max |logit| {np.max(np.abs(want)):.2f}, tol {LOGIT_TOL:g})", diff <= LOGIT_TOL)
    return diff


def convert_check(tag, model, d, tmp):
    out = os.path.join(tmp, f"{tag}-conv")
    p = lib.loom("convert", d, out)
    if p.returncode:
        return check(f"{tag}: loom convert runs", False, p.stderr[-500:])
    src, got = load_file(os.path.join(d, "model.safetensors")), load_file(os.path.join(out, "model.safetensors"))
    check(f"{tag}: loom convert of the directory: every tensor bit for bit ({len(src)} tensors)",
          sorted(got) == sorted(src) and all(torch.equal(got[k], src[k]) for k in src))
    back, info = MixtralForCausalLM.from_pretrained(out, output_loading_info=True, attn_implementation="eager")
    missing, unexpected = info["missing_keys"], info["unexpected_keys"]
    check(f"{tag}: transformers loads loom's export with no missing or unexpected keys",
          not missing and not unexpected, f"missing {missing}, unexpected {unexpected}")
    cfg = json.load(open(os.path.join(out, "config.json")))
    check(f"{tag}: ... whose config.json states the experts",
          cfg.get("num_local_experts") == model.config.num_local_experts and cfg.get("num_experts_per_tok") == 2
          and cfg.get("intermediate_size") == 96, str(cfg))


def balance_terms(lg, k):
    """Megatron's Switch loss and z-loss of one MoE layer over one
    micro-batch, unweighted."""
    N, E = lg.shape
    probs = torch.softmax(lg, dim=-1)
    chosen = torch.topk(lg, k, dim=-1).indices
    f = torch.zeros(E).scatter_add_(0, chosen.reshape(-1), torch.ones(N * k))
    return E / (N * N * k) * torch.sum(probs.sum(0) * f), torch.mean(torch.logsumexp(lg, dim=-1) ** 2)


def balance_losses(router_logits, k, aux, z):
    """Megatron's per-layer Switch loss and z-loss over one micro-batch, weighted."""
    total = 0.0
    for lg in router_logits:  # (N, E) per MoE layer
        lb, zl = balance_terms(lg, k)
        total = total + aux * lb + z * zl
    return total


def train_check(tag, model, d, tmp, aux=0.0, z=0.0, loom_extra=(), step_loss=None):
    """20 steps of `loom train --load DIR` against the same steps in PyTorch
    (step_loss(x, y): the language model's loss and what the gradient adds;
    default Mixtral's with Megatron's balancing losses of aux and z)."""
    G, clip, HT = 8, 1.0, T
    tokens = train.make_tokens(30000, 3) % V
    tag_file = tag.replace(" ", "-")
    data = os.path.join(tmp, f"{tag_file}-train.bin")
    shard.write(data, tokens)
    metrics, ck = os.path.join(tmp, f"{tag_file}-train.jsonl"), os.path.join(tmp, f"{tag_file}-ck")
    args = ["--load", d, "--data-path", data, "--data-order", "sequential", "--seq-length", HT,
            "--micro-batch-size", G // 2, "--global-batch-size", G, "--train-iters", train.ITERS, "--lr",
            train.MAX_LR, "--min-lr", train.MIN_LR, "--lr-warmup-iters", train.WARMUP, "--lr-decay-style", "cosine",
            "--weight-decay", train.WD, "--adam-beta1", train.BETA1, "--adam-beta2", train.BETA2, "--adam-eps",
            train.EPS, "--clip-grad", clip, "--log-interval", 1, "--eval-iters", 0, "--metrics", metrics,
            "--threads", 2, "--save", ck]
    tb = os.path.join(tmp, f"{tag_file}-tb")
    args += ["--moe-per-layer-logging", "--tensorboard-dir", tb]  # each layer's values, in the metrics and TensorBoard
    if aux or z:
        args += ["--moe-aux-loss-coeff", aux, "--moe-z-loss-coeff", z]
    args += list(loom_extra)
    p = lib.loom("train", *[str(a) for a in args], timeout=600)
    if p.returncode != 0:
        return check(f"{tag}: loom train --load of its directory", False, p.stderr[-500:]), []
    got = [r["loss"] for r in lib.metrics_rows(metrics)]
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train.WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=train.MAX_LR, betas=(train.BETA1, train.BETA2), eps=train.EPS)
    nblocks, want, want_lb, want_z, want_layers = (len(tokens) - 1) // (G * HT), [], [], [], []
    for s in range(train.ITERS):
        for g in opt.param_groups:
            g["lr"] = train.lr_at(s + 1)
        opt.zero_grad(set_to_none=True)
        start = (s % nblocks) * G * HT
        block = torch.tensor(tokens[start:start + G * HT + 1].astype(np.int64))
        total, terms = 0.0, []
        for a in range(2):
            rows = range(a * G // 2, (a + 1) * G // 2)
            x = torch.stack([block[r * HT:(r + 1) * HT] for r in rows])
            y = torch.stack([block[r * HT + 1:(r + 1) * HT + 1] for r in rows])
            if step_loss:
                loss, extra = step_loss(x, y)
            else:
                logits, router = forward(model, x, router=True)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
                extra = balance_losses(router, 2, aux, z) if aux or z else 0.0
                terms += [balance_terms(lg.detach(), 2) for lg in router]
            ((loss + extra) / 2).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        want.append(total / 2)
        if terms:
            want_lb.append(sum(float(t[0]) for t in terms) / len(terms))
            want_z.append(sum(float(t[1]) for t in terms) / len(terms))
            nl = len(terms) // 2
            want_layers.append([(sum(float(terms[a * nl + i][0]) for a in range(2)) / 2,
                                 sum(float(terms[a * nl + i][1]) for a in range(2)) / 2) for i in range(nl)])
    worst = max((abs(a - b) / b for a, b in zip(got, want)), default=1.0)
    what = (f"with --moe-aux-loss-coeff {aux} --moe-z-loss-coeff {z}" if aux or z
            else "against the reference" if step_loss else "from its directory")
    check(f"{tag}: 20 training steps {what}, every loss PyTorch's (worst rel {worst:.1e}, tol {STEP_TOL:g})",
          len(got) == train.ITERS and worst <= STEP_TOL, f"{got} vs {want}")
    if want_lb:  # what the step rows report: Megatron's load_balancing_loss and z_loss, means over layers and micro-batches
        rows = lib.metrics_rows(metrics)
        lb = max((abs(r["load_balancing_loss"] - w) / w for r, w in zip(rows, want_lb)), default=1.0)
        zl = max((abs(r["z_loss"] - w) / w for r, w in zip(rows, want_z)), default=1.0)
        check(f"{tag}: every step's reported load_balancing_loss and z_loss the reference's (worst rel "
              f"{lb:.1e}, {zl:.1e}, tol {STEP_TOL:g})", len(rows) == train.ITERS and max(lb, zl) <= STEP_TOL)
        # --moe-per-layer-logging: each layer's, the mean of its two micro-batches' terms (a step's terms are
        # micro-batch by micro-batch, layer by layer)
        nl = len(want_layers[0]) if want_layers else 0
        worst = 0.0
        ok = len(rows) == train.ITERS and nl > 0
        for r, w in zip(rows, want_layers):
            got_layers = r["moe"].get("layers", [])
            ok = ok and [x["layer"] for x in got_layers] == list(range(nl))
            for x, (wl, wz) in zip(got_layers, w):
                worst = max(worst, abs(x["load_balancing_loss"] - wl) / wl, abs(x["z_loss"] - wz) / wz)
        check(f"{tag}: --moe-per-layer-logging: every step's {nl} layers' balancing loss and z-loss the reference's "
              f"(worst rel {worst:.1e}, tol {STEP_TOL:g})", ok and worst <= STEP_TOL)
        events = [os.path.join(tb, f) for f in os.listdir(tb)] if os.path.isdir(tb) else []
        blob = b"".join(open(f, "rb").read() for f in events)
        tags = [f"moe/{k}_layer_{i}".encode() for i in range(nl) for k in ("load_balancing_loss", "z_loss")]
        check(f"{tag}: TensorBoard has Megatron's per-layer tags (moe/load_balancing_loss_layer_0 ...)",
              nl > 0 and all(t in blob for t in tags))
    return worst, got


def hf_form_check(tmp, experts):
    """A directory saved with output_router_logits true and
    router_aux_loss_coef 0.02: loom trains with Hugging Face's balancing
    loss over all layers' router logits, transformers' own
    load_balancing_loss_func in the reference's loss, and names the form in
    its printed settings."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    model = hf_model(experts, 5)
    model.config.output_router_logits, model.config.router_aux_loss_coef = True, 0.02
    d = os.path.join(tmp, f"hf-mixtral-{experts}-router-logits")
    model.save_pretrained(d)
    p = lib.loom("train", "--load", d, "--seq-length", str(T), "--train-iters", "1", "--dry-run")
    named = [line for line in p.stdout.splitlines() if "moe-router-load-balancing-type" in line]
    check("output_router_logits true: the printed settings name hf_aux_loss, and the weight 0.02",
          p.returncode == 0 and named and "hf_aux_loss" in named[0] and
          any("moe-aux-loss-coeff" in line and "0.02" in line for line in p.stdout.splitlines()), p.stdout[-800:])

    def step_loss(x, y):
        logits, router = forward(model, x, router=True)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        return loss, 0.02 * load_balancing_loss_func(router, experts, 2)

    train_check(f"mixtral top 2 of {experts}, Hugging Face's balancing loss", model, d, tmp, step_loss=step_loss)


# ---- an independent reference: Megatron's routing with shared experts and capacities ----

class RefExpert(torch.nn.Module):
    def __init__(self, C, F):
        super().__init__()
        self.gate_proj = torch.nn.Linear(C, F, bias=False)
        self.up_proj = torch.nn.Linear(C, F, bias=False)
        self.down_proj = torch.nn.Linear(F, C, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class RefMoE(torch.nn.Module):
    """Megatron's MoE layer as its documentation states it, written from
    that text: the router's top k (the softmax of the top k logits, or the
    top k of the softmax), each expert's capacity ceil(N k / E x factor)
    keeping the choices with the largest weights (probs) or the first in
    token order (position), the rest dropped (weight 0, no
    renormalisation), the experts' outputs weighted and summed, plus the
    shared experts. Padding changes no value (a padded row is zeros, or a
    row of weight 0), so the reference has none. Names as loom's Llama
    family writes them."""

    def __init__(self, C, E, F, Fs, k, factor, policy, pre):
        super().__init__()
        self.gate = torch.nn.Linear(C, E, bias=False)
        self.experts = torch.nn.ModuleList([RefExpert(C, F) for _ in range(E)])
        self.shared_experts = RefExpert(C, Fs) if Fs else None
        self.E, self.k, self.factor, self.policy, self.pre = E, k, factor, policy, pre
        self.logits, self.dropped = [], 0

    def forward(self, x):
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        N, E, k = h.shape[0], self.E, self.k
        logits = self.gate(h)
        self.logits.append(logits)
        if self.pre:
            w, idx = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        else:
            top, idx = torch.topk(logits, k, dim=-1)
            w = torch.softmax(top, dim=-1)
        keep = torch.ones(N, k, dtype=torch.bool)
        if self.factor:
            cap = math.ceil(N * k / E * self.factor)
            flat_idx, flat_w = idx.reshape(-1), w.detach().reshape(-1)
            for e in range(E):
                chosen = [i for i in range(N * k) if flat_idx[i] == e]  # token order
                if len(chosen) <= cap:
                    continue
                if self.policy == "probs":
                    chosen.sort(key=lambda i: (-float(flat_w[i]), i))
                for i in chosen[cap:]:
                    keep[i // k, i % k] = False
                self.dropped += len(chosen) - cap
        out = torch.zeros_like(h)
        for e in range(E):
            n, j = torch.nonzero((idx == e) & keep, as_tuple=True)
            if len(n):
                out = out.index_add(0, n, self.experts[e](h[n]) * w[n, j, None])
        if self.shared_experts is not None:
            out = out + self.shared_experts(h)
        return out.reshape(shape)


REF_SHAPE = ["--model", "llama-tiny", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
             "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", str(T), "--max-position-embeddings",
             str(T), "--num-experts", "4", "--moe-ffn-hidden-size", "48"]


def reference_check(tmp, tag, k, Fs, factor, policy, pre, pad, aux, layers=None):
    """A Llama with experts initialised by loom, trained 20 steps by loom and
    by the reference from the same weights; layers: a --moe-layer-freq list
    (the reference's MoE layers: those with a 1)."""
    flags = REF_SHAPE + ["--moe-router-topk", str(k)]
    if layers:
        flags += ["--moe-layer-freq", layers]
    if Fs:
        flags += ["--moe-shared-expert-intermediate-size", str(Fs)]
    if pre:
        flags += ["--moe-router-pre-softmax"]
    name = tag.replace(" ", "-").replace(",", "")
    ck0, init = os.path.join(tmp, f"{name}-ck0"), os.path.join(tmp, f"{name}-init.safetensors")
    p = lib.loom("train", *flags, "--train-iters", "1", "--lr", "0", "--min-lr", "0", "--eval-iters", "0",
                 "--micro-batch-size", "2", "--global-batch-size", "2", "--data-path", os.path.join(tmp, "train.bin"),
                 "--save", ck0, "--seed", "11")
    q = lib.loom("convert", ck0, init) if p.returncode == 0 else p
    if q.returncode:
        return check(f"{tag}: loom initialises and converts the model", False, (p.stderr + q.stderr)[-500:])
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=T, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    moe_layers = [int(c) for c in layers.strip("[]").split(",")] if layers else [1] * len(model.model.layers)
    for layer, moe in zip(model.model.layers, moe_layers):
        if moe:
            layer.mlp = RefMoE(64, 4, 48, Fs, k, factor, policy, pre)
    weights = load_file(init)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    check(f"{tag}: the reference takes every loom tensor by its name",
          not unexpected and set(missing) <= {"lm_head.weight"}, f"missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    extra = ["--moe-aux-loss-coeff", str(aux)] if aux else []
    if factor:
        extra += ["--moe-expert-capacity-factor", str(factor), "--moe-token-drop-policy", policy]
    if pad:
        extra += ["--moe-pad-expert-input-to-capacity"]
    moes = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, RefMoE)]

    def step_loss(x, y):
        for mo in moes:
            mo.logits = []
        loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits.reshape(-1, V), y.reshape(-1))
        logits = [lg for mo in moes for lg in mo.logits]
        return loss, (balance_losses(logits, k, aux, 0.0) if aux else 0.0)

    worst, _ = train_check(tag, model, init, tmp, loom_extra=extra, step_loss=step_loss)
    if factor:
        check(f"{tag}: ... the capacity dropped choices in the reference ({sum(mo.dropped for mo in moes)})",
              sum(mo.dropped for mo in moes) > 0)
    return worst


def layouts(tmp):
    base = ["--model", "mixtral-tiny", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
            "--num-query-groups", "2", "--ffn-hidden-size", "64", "--num-experts", "4", "--seq-length", "16",
            "--max-position-embeddings", "16", "--global-batch-size", "8", "--micro-batch-size", "2",
            "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001"]
    one = lib.tiny_run(tmp, "moe-one", 1, base)
    for tag, n, extra in (("DDP 2", 2, []), ("ZeRO-3", 2, ["--zero-stage", "3"]),
                          ("PP 2", 2, ["--pipeline-model-parallel-size", "2"])):
        lib.compare_runs(f"mixtral {tag}", one, lib.tiny_run(tmp, f"moe-{tag[:4].strip()}", n, base + extra))
    full = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"]
    lib.same_run("mixtral full recomputation", one, lib.tiny_run(tmp, "moe-full", 1, base + full))
    # --layout-invariant: the same layouts and TP 2 + SP (the experts whole on each tensor-parallel rank) give
    # one process's bits (expert parallelism's: test_expert_parallel.py)
    inv = base + ["--layout-invariant", "2"]
    one_inv = lib.tiny_run(tmp, "moe-inv-one", 1, inv)
    for tag, n, extra in (("DDP 2", 2, []), ("ZeRO-3", 2, ["--zero-stage", "3"]),
                          ("PP 2", 2, ["--pipeline-model-parallel-size", "2"]),
                          ("TP 2 + SP", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"])):
        lib.same_run(f"mixtral {tag} --layout-invariant 2", one_inv,
                     lib.tiny_run(tmp, f"moe-inv-{tag[:4].strip()}", n, inv + extra))
    # 16-bit activations, at lr 0 (lib.same_steps_at_lr0 says why: trained, a routing flip parts the runs);
    # full recomputation reruns the same bf16 kernels: the same bits, trained
    zero = ["--lr", "0"]
    lib.tiny_run(tmp, "moe-bf16-lr0", 1, base + ["--bf16"] + zero)
    for tag, n, extra in (("DDP 2", 2, []), ("ZeRO-3", 2, ["--zero-stage", "3"]), ("PP 2", 2, ["--pipeline-model-parallel-size", "2"])):
        name = f"moe-bf16-{tag[:4].strip()}"
        lib.tiny_run(tmp, name, n, base + ["--bf16"] + extra + zero)
        lib.same_steps_at_lr0(f"mixtral bf16 {tag}", os.path.join(tmp, "moe-bf16-lr0.jsonl"),
                              os.path.join(tmp, f"{name}.jsonl"))
    b1 = lib.tiny_run(tmp, "moe-bf16", 1, base + ["--bf16"])
    lib.same_run("mixtral bf16 full recomputation", b1, lib.tiny_run(tmp, "moe-bf16-full", 1, base + ["--bf16"] + full))
    moved = max(abs(a - b) / b for a, b in zip(b1[0], one[0]))
    check(f"mixtral bf16: not the float32 run, and near it (max rel {moved:.1e}, in (0, 0.02))", 0 < moved < 0.02)
    f16 = base + ["--fp16", "--initial-loss-scale", "1024"] + zero
    lib.tiny_run(tmp, "moe-fp16", 1, f16)
    lib.tiny_run(tmp, "moe-fp16-ddp", 2, f16)
    lib.same_steps_at_lr0("mixtral fp16 DDP 2", os.path.join(tmp, "moe-fp16.jsonl"),
                          os.path.join(tmp, "moe-fp16-ddp.jsonl"))
    # any family: Llama with shared experts in every other layer, GPT-2's dense experts with pre-softmax routing
    for fam, extra in (("llama", ["--moe-shared-expert-intermediate-size", "32", "--moe-layer-freq", "2"]),
                       ("gpt2", ["--moe-router-pre-softmax"])):
        flags = ["--model", f"{fam}-tiny", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                 "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--seq-length", "16",
                 "--max-position-embeddings", "16", "--global-batch-size", "8", "--micro-batch-size", "2",
                 "--moe-aux-loss-coeff", "0.01"] + extra
        if fam == "llama":
            flags += ["--num-query-groups", "2", "--ffn-hidden-size", "64"]
        one = lib.tiny_run(tmp, f"{fam}-moe-one", 1, flags)
        lib.compare_runs(f"{fam} with experts ({' '.join(extra)}) DDP 2", one,
                         lib.tiny_run(tmp, f"{fam}-moe-ddp", 2, flags))
        if fam == "llama":
            layer_lists(tmp, flags, one)


def layer_lists(tmp, flags, every2):
    """--moe-layer-freq as Megatron's list expression: "([1]+[0])*2" is
    "2"'s layers (the same bits); a list whose first layer is dense
    ("[0]+[1]*3") under PP 2 is one process's, and its checkpoint at step 10
    resumes without the flag (the checkpoint records the layers), finishing
    the uninterrupted run's steps."""
    base = [f for i, f in enumerate(flags) if f != "--moe-layer-freq" and flags[i - 1] != "--moe-layer-freq"]
    lib.same_run("--moe-layer-freq \"([1]+[0])*2\" is 2's layers", every2,
                 lib.tiny_run(tmp, "llama-moe-list2", 1, base + ["--moe-layer-freq", "([1]+[0])*2"]))
    dense_first = ["--moe-layer-freq", "[0]+[1]*3"]
    one = lib.tiny_run(tmp, "llama-moe-list", 1, base + dense_first)
    moved = max(abs(a - b) / b for a, b in zip(one[0], every2[0]))
    check(f"--moe-layer-freq \"[0]+[1]*3\" is another model (max rel {moved:.1e} from 2's, above 1e-4)",
          moved > 1e-4)
    lib.compare_runs("--moe-layer-freq \"[0]+[1]*3\" PP 2", one,
                     lib.tiny_run(tmp, "llama-moe-list-pp2", 2, base + dense_first +
                                  ["--pipeline-model-parallel-size", "2"]))
    lib.resume_check(tmp, "--moe-layer-freq list, resumed without the flag", base, (1, dense_first), (1, []), one)


def export_refusals(tmp):
    """What transformers cannot express is not exported: a Llama with experts, a Mixtral with pre-softmax
    routing. One line, exit 2, and no directory written."""
    corpus = os.path.join(tmp, "train.bin")
    for tag, flags, want in (
            ("a Llama with experts", ["--model", "llama-tiny", "--num-experts", "4"], "has no experts"),
            ("a Mixtral with pre-softmax routing", ["--model", "mixtral-tiny", "--moe-router-pre-softmax"],
             "no form there")):
        ck, out = os.path.join(tmp, f"exp-{flags[1]}"), os.path.join(tmp, f"exp-{flags[1]}-hf")
        p = lib.loom("train", *flags, "--train-iters", "1", "--eval-iters", "0", "--data-path", corpus, "--save", ck)
        q = lib.loom("convert", ck, out) if p.returncode == 0 else p
        errs = lib.error_lines(q.stderr)
        check(f"exporting {tag} to a Hugging Face directory: one line, exit 2, nothing written",
              q.returncode == 2 and len(errs) == 1 and want in errs[0] and not os.path.exists(os.path.join(out, "config.json")),
              q.stderr[-400:])


def refusals():
    base = ["train", "--model", "mixtral-tiny", "--train-iters", "1", "--dry-run"]
    cases = [
        (["--moe-router-topk", "9"], "--moe-router-topk 9 exceeds --num-experts 8"),
        (["--num-experts", "0"], "mixtures of experts"),
        (["--expert-model-parallel-size", "2"], "not divisible by expert-parallel size 2"),
        (["--bf16", "--fp8-format", "hybrid"], "--fp8-format"),
        (["--moe-shared-expert-intermediate-size", "64"], "no shared experts"),
        (["--moe-router-load-balancing-type", "sinkhorn"], "--moe-router-load-balancing-type"),
        (["--moe-layer-freq", "2"], "experts in every layer"),
        (["--moe-layer-freq", "[1,1,1,0]"], "experts in every layer"),
        (["--moe-layer-freq", "[1,1]"], "gives 2 layers; the model has 4"),
        (["--moe-layer-freq", "[1,2,1,1]"], "must be 0 (dense) or 1 (experts)"),
        (["--moe-layer-freq", "([1]*4"], "')' expected"),
        (["--moe-layer-freq", "0"], "an integer must be in [1, 1024]"),
        (["--moe-expert-capacity-factor", "0"], "at least one token"),
        (["--moe-pad-expert-input-to-capacity"], "needs --moe-expert-capacity-factor"),
        (["--moe-token-drop-policy", "position"], "needs --moe-expert-capacity-factor"),
    ]
    for extra, want in cases:
        p = lib.loom(*base, *extra)
        errs = lib.error_lines(p.stderr)
        check(f"refused, one line, exit 2: {' '.join(extra)}",
              p.returncode == 2 and len(errs) == 1 and want in errs[0], f"rc {p.returncode}: {p.stderr[-400:]}")
    for extra, want in ((["--tensor-model-parallel-size", "2", "--moe-ffn-hidden-size", "33"],
                         "--tensor-model-parallel-size 2 must divide --moe-ffn-hidden-size 33"),
                        (["--context-parallel-size", "2", "--moe-expert-capacity-factor", "1"],
                         "--context-parallel-size above 1 and --moe-expert-capacity-factor"),
                        (["--pipeline-model-parallel-size", "2", "--moe-router-load-balancing-type", "hf_aux_loss"],
                         "hf_aux_loss with --pipeline-model-parallel-size 2")):
        p = lib.run(lib.mpirun(2, [lib.LOOM, *base, *extra]), timeout=120, env=lib.ENV)
        errs = lib.error_lines(p.stderr)
        check(f"refused, one line, exit 2: {' '.join(extra)} (2 ranks)",
              p.returncode == 2 and errs and all(want in e for e in errs), p.stderr[-400:])
    p = lib.loom("train", "--model", "llama-tiny", "--moe-router-topk", "2", "--train-iters", "1", "--dry-run")
    errs = lib.error_lines(p.stderr)
    check("refused, one line, exit 2: an MoE setting without --num-experts",
          p.returncode == 2 and len(errs) == 1 and "--num-experts" in errs[0], p.stderr[-400:])


def main():
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        for experts in (4, 8):
            tag = f"mixtral top 2 of {experts}"
            model = hf_model(experts, 3)
            d = os.path.join(tmp, f"hf-mixtral-{experts}")
            model.save_pretrained(d)
            figures.append(logits_check(tag, model, d, tmp))
            convert_check(tag, model, d, tmp)
            if experts == 4:
                worst, plain = train_check(tag, model, d, tmp)
                figures.append(worst)
                worst, balanced = train_check(tag + " balanced", hf_model(experts, 3), d, tmp, aux=0.01, z=0.001)
                figures.append(worst)
                hf_form_check(tmp, experts)
                if plain and balanced:
                    moved = max(abs(a - b) / b for a, b in zip(balanced, plain))
                    check(f"{tag}: ... the balancing losses move the run (rel {moved:.1e} from the plain one, "
                          "above 1e-4)", moved > 1e-4)
        refusals()
        export_refusals(tmp)
        for tag, k, Fs, factor, policy, pre, pad, aux in (
                ("shared experts", 2, 48, 0, "probs", False, False, 0.01),
                ("capacity 1, drop by probs", 2, 0, 1.0, "probs", False, False, 0.01),
                ("capacity 1, drop by position, padded", 2, 0, 1.0, "position", False, True, 0.0),
                ("pre-softmax top 1, capacity 0.5, shared experts", 1, 32, 0.5, "probs", True, False, 0.01)):
            figures.append(reference_check(tmp, tag, k, Fs, factor, policy, pre, pad, aux))
        # Megatron's list form of --moe-layer-freq: the first layer dense, the second with experts
        figures.append(reference_check(tmp, "moe-layer-freq list, layer 0 dense", 2, 0, 0, "probs", False, False, 0.01,
                                       layers="[0,1]"))
        layouts(tmp)
    print(f"     max logit diffs and loss rel diffs: {figures}")
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
