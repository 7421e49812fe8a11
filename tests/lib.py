"""What the Python tests share: where the build is, the environment mpirun
needs, running loom (in one process or on N ranks), one line per check and
the closing verdict, the corpus, and the comparisons that more than one test
makes. Also the tiny GPT-2 run and its comparison that the data-parallel
tests (test_ddp, test_zero, test_offload) all use.

Tests run from the repository root as `env BUILD=build python3
tests/test_x.py` (tests/run.sh). Python puts the script's folder first on
sys.path, so a test needs only `import lib` and `from pyref import ...`.
BUILD (default build) is the build folder, relative to the repository root
or absolute.

Not here: what a test proves. Its cases, flags, tolerances and messages stay
in the test file; the PyTorch references are in tests/pyref/.

numpy is imported by the functions that use it, so that the tests that only
run programs (test_comm, test_fuzz, ...) need nothing beyond the standard
library.
"""
import json
import os
import sys
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
LOOM = os.path.join(BUILD, "loom")
# For mpirun: Open MPI refuses to start as root without the first two, and the
# third makes a waiting rank give up its core (the runs oversubscribe). The
# fourth: with munge installed (Slurm's, for test_slurm) and the socket of a
# munged that is gone left behind (a machine restored from an image taken
# while it ran), PMIx's security layer retries that socket for 2.3 s at
# every mpirun before it takes the native one; the suite starts hundreds.
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_mpi_yield_when_idle="1", PMIX_MCA_psec=os.environ.get("PMIX_MCA_psec", "native"))


def tool(name):
    """A test program built from tests/tools/NAME.c."""
    return os.path.join(BUILD, "tests", "tools", name)


def built(path):
    """Whether the program at path is there; when not, says FAIL with a hint."""
    if os.access(path, os.X_OK):
        return True
    print(f"FAIL: {path} not built (run make)")
    return False


# ---- checks and the verdict -------------------------------------------------

failures = 0  # checks of this process that failed so far


def check(name, cond, detail="", indent=""):
    """One line per check, 'ok   NAME' or 'FAIL NAME: DETAIL' (the detail only
    on failure); a failed one counts in failures. Returns whether it passed."""
    global failures
    print(f"{indent}{'ok  ' if cond else 'FAIL'} {name}" + (f": {detail}" if detail and not cond else ""))
    failures += 0 if cond else 1
    return bool(cond)


def verdict(fails=None):
    """The closing line, PASS or FAIL with the count of failures (those of
    check unless given); returns the exit status."""
    n = failures if fails is None else fails
    print(f"{'PASS' if n == 0 else 'FAIL'}: {n} failure(s)")
    return 1 if n else 0


# ---- running programs -------------------------------------------------------

def bf16_units(forced=None):
    """The units loom's bf16 products run on under LOOM_BF16_UNITS=forced
    (kernels/cpu/matmul_bf16.c's rule, from /proc/cpuinfo): auto is the
    CPU's best (amx, avx512_bf16, else f32); a forced path runs bf16
    arithmetic wherever the CPU has AVX512 (oneDNN's cap is a ceiling), and
    is f32 on a CPU without it, as f32 is everywhere."""
    try:
        flags = set(" ".join(line.split(":", 1)[1] for line in open("/proc/cpuinfo")
                             if line.startswith("flags")).split())
    except OSError:
        flags = set()
    best = ("amx" if {"amx_bf16", "amx_tile"} <= flags else "avx512_bf16" if "avx512_bf16" in flags else "f32")
    if forced in (None, "", "auto"):
        return best
    core = {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags
    return forced if forced != "f32" and core else "f32"


def run(cmd, timeout=None, env=None, **kw):
    """cmd (each item made a string), its output captured as text; env None
    passes this process's environment unchanged."""
    return subprocess.run([str(a) for a in cmd], capture_output=True, text=True, timeout=timeout, env=env, **kw)


def mpirun(n, cmd, mpi_args=()):
    """The command that runs cmd on n ranks: under mpirun, oversubscribed and
    unbound, with mpi_args before the program; cmd itself when n is 1."""
    if n == 1:
        return list(cmd)
    return ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", *mpi_args] + list(cmd)


def run_ranks(n, cmd, expect=0, tag=None, timeout=300, env=ENV, mpi_args=(), **kw):
    """cmd on n ranks (see mpirun) with ENV. An exit status other than expect
    (None: any) ends the test with a message naming tag (default: cmd) and
    stderr's tail."""
    p = run(mpirun(n, cmd, mpi_args), timeout=timeout, env=env, **kw)
    if expect is not None and p.returncode != expect:
        name = tag or " ".join(str(a) for a in cmd)
        raise SystemExit(f"{name}: exit {p.returncode}, expected {expect}\n{p.stderr[-2000:]}")
    return p


def loom_ranks(marker):
    """pid -> world rank (0 outside mpirun) of the running loom processes
    whose command line holds marker."""
    import glob
    out = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            cmdline = open(d + "/cmdline", "rb").read().split(b"\0")
            if not cmdline or not cmdline[0].endswith(b"loom") or marker.encode() not in b" ".join(cmdline):
                continue
            env = open(d + "/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        rank = [int(e.split(b"=")[1]) for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")]
        out[int(d[6:])] = rank[0] if rank else 0
    return out


def finish(p, timeout):
    """(stdout, stderr, seconds) of a started process, killed past timeout."""
    import time
    t0 = time.time()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return out, err, time.time() - t0


def loom(*args, timeout=120, env=None, exe=LOOM):
    """`loom ARGS` in one process."""
    return run([exe, *args], timeout=timeout, env=env)


def error_lines(stderr):
    """The 'loom: error:' lines of stderr."""
    return [line for line in stderr.splitlines() if line.startswith("loom: error:")]


def metrics_rows(path):
    """The step rows (those with a loss) of a --metrics file; none when it is missing."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


def train_steps(args, metrics, timeout=600, env=None):
    """`loom train ARGS` in one process, ARGS naming metrics as --metrics
    (env: its environment, None this one's). Returns ({step: metrics row},
    None), or (None, why) when loom failed."""
    p = run([LOOM, "train", *args], timeout=timeout, env=env)
    if p.returncode != 0:
        return None, f"loom exited {p.returncode}: {p.stderr.strip()[-2000:]}"
    return {r["step"]: r for r in metrics_rows(metrics)}, None


def make(build, target, *settings):
    """`make TARGET` of this repository into the build folder `build`, with
    settings such as CC=...; output captured."""
    return run(["make", "-C", ROOT, f"BUILD={build}", *settings, "-j2", target])


ASAN_BUILD = os.path.join(BUILD, "asan-loom")
ASAN_LOOM = os.path.join(ASAN_BUILD, "loom")


def make_asan_loom():
    """ASAN_LOOM: loom built with AddressSanitizer and UndefinedBehaviorSanitizer
    (test_asan_parallel builds it; test_convert uses it when it is there)."""
    return make(ASAN_BUILD, ASAN_LOOM,
                "CC=gcc -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined")


# ---- corpus -----------------------------------------------------------------

def synth(dest, tokens, exe=LOOM, env=None):
    """`loom data synth`: the built-in corpus of `tokens` tokens as dest/train.bin and dest/val.bin."""
    subprocess.run([exe, "data", "synth", dest, "--tokens", str(tokens)], check=True, capture_output=True, env=env)


def write_corpus(tmp):
    """The built-in corpus as tmp/train.bin: gradients carry signal, not just noise (see compare_runs)."""
    synth(os.path.join(tmp, "corpus"), 200000)
    os.rename(os.path.join(tmp, "corpus", "train.bin"), os.path.join(tmp, "train.bin"))


# ---- comparisons ------------------------------------------------------------

def rel(a, b):
    """Relative error of a against b."""
    return abs(a - b) / abs(b)


def rel_l2(got, ref):
    """||got - ref|| / ||ref|| in float64 (the absolute error when ref is zero)."""
    import numpy as np

    d = np.linalg.norm((got.astype(np.float64) - ref).ravel())
    n = np.linalg.norm(ref.ravel())
    return d / n if n > 0 else d


def without_key_bias(name, a):
    """a, less the key third of attn.c_attn.bias ([q|k|v]) when name is one.
    Its exact gradient is zero (softmax ignores a shift shared by all keys),
    so what it holds is float rounding noise."""
    import numpy as np

    if not name.endswith("attn.c_attn.bias"):
        return a
    c = a.shape[0] // 3
    return np.r_[a[:c], a[2 * c:]]


def same_bits(a, b):
    """Same dtype, shape and bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def differing(a, b):
    """Names of the tensors of {name: array} a and b that are in one only or
    differ in any bit (dtype and shape included): those in one only first,
    each part sorted."""
    return sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if not same_bits(a[k], b[k]))


# ---- the data-parallel tests' run: test_ddp, test_zero, test_offload --------

TINY_MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
              "--max-position-embeddings", "16", "--vocab-size", "256"]
STEPS = 20


def tiny_run(tmp, tag, np_ranks, extra):
    """TINY_MODEL trained STEPS steps on tmp/train.bin (write_corpus) on
    np_ranks ranks with the flags extra, saved in tmp/TAG with metrics in
    tmp/TAG.jsonl. Returns (per-step losses, final weights, stdout)."""
    from pyref import ckpt

    metrics = os.path.join(tmp, f"{tag}.jsonl")
    save = os.path.join(tmp, tag)
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--data-order", "shuffled"] + TINY_MODEL + [
        "--train-iters", str(STEPS), "--lr", "3e-3", "--lr-warmup-iters", "3", "--clip-grad", "0.5",
        "--weight-decay", "0.1", "--log-interval", "1", "--eval-iters", "0", "--threads", "1", "--seed", "7",
        "--metrics", metrics, "--save", save, "--ddp-bucket-size", "0.01", "--comm-timeout", "60"] + extra
    p = run_ranks(np_ranks, cmd, tag=tag)
    out = Run(([r["loss"] for r in metrics_rows(metrics)], ckpt.weights(save), p.stdout))
    out.remake = (tmp, tag, np_ranks, extra)
    return out


def check_refused(name, p, needles):
    """One check line: the finished process p exited 2 with one error line
    holding every string of needles; the line is printed under it."""
    lines = error_lines(p.stderr)
    ok = check(f"{name}: exit 2, one line", p.returncode == 2 and len(lines) == 1 and
               all(s in lines[0] for s in needles), f"exit {p.returncode}: {p.stderr[-600:]}")
    if lines:
        print(f"     {lines[0]}")
    return ok


def resume_check(tmp, tag, flags, first, then, one, tol=1e-5):
    """One check line: tiny_run with flags on first = (ranks, layout flags)
    stops at step 10 (--exit-interval 10), and its checkpoint resumed on
    then = (ranks, layout flags) finishes the STEPS steps; the 20 losses
    against the uninterrupted run one's, within tol relative."""
    name = "resume-" + "".join(c for c in tag if c.isalnum())
    half = tiny_run(tmp, f"{name}-a", first[0], flags + first[1] + ["--exit-interval", "10"])
    metrics = os.path.join(tmp, f"{name}-b.jsonl")
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--data-order", "shuffled"] + flags + \
        then[1] + ["--train-iters", str(STEPS), "--lr", "3e-3", "--lr-warmup-iters", "3", "--clip-grad", "0.5",
                   "--weight-decay", "0.1", "--log-interval", "1", "--eval-iters", "0", "--threads", "1", "--seed",
                   "7", "--metrics", metrics, "--load", os.path.join(tmp, f"{name}-a"), "--comm-timeout", "60"]
    run_ranks(then[0], cmd, tag=tag)
    got = half[0][:10] + [r["loss"] for r in metrics_rows(metrics)]
    worst = max((rel(a, b) for a, b in zip(got, one[0])), default=1.0)
    return check(f"{tag}: {len(got)} steps, worst loss rel err {worst:.1e} (tol {tol:g})",
                 len(got) == STEPS and worst <= tol, f"{got} vs {one[0]}")


class Run(tuple):
    """tiny_run's (per-step losses, final weights, stdout), with remake =
    the arguments that made it (for reorder_noise)."""
    remake = None


# How far one tensor's final weights move when the same run sums its float32
# gradients in another order. Adam divides each gradient element by the root
# of its own running square: an element whose gradient is small and made of
# sums that cancel gets a step whose size the last bits of those sums decide,
# so a tensor holding a few such elements moves by far more than float32's
# 2^-24 and by an amount no formula gives in advance (measured on the 8-layer
# model: 5e-6 to 1.7e-5 for the worst tensor when one process only changes its
# micro-batch size; 1.05e-5 under TP 2, which also only reorders sums). So a
# tensor's bound is REORDER_FACTOR times the worst tensor's move that this
# machine's own reordering gives, measured in the test, when that exceeds the
# fixed bound. A wrong gradient moves a tensor by orders of magnitude more.
# The per-step loss likewise: in a 16-bit run a flipped rounding moves it by
# an amount set by how many roundings flip (measured 4e-5 under TP 2 in bf16
# against a fixed 1e-4), so past its fixed bound it is judged against
# REORDER_FACTOR times the loss's move under the same reordering.
REORDER_FACTOR = 4
_reorder_cache = {}


def reorder_noise(ref):
    """The worst tensor's relative L2 distance between the run ref (from
    tiny_run) and the same run with its micro-batch size doubled and
    quadrupled (the same math; the gradient sums taken in another order),
    the larger of the two; None when ref cannot be remade so (no micro-batch
    size given, or the global batch does not divide). Measured once a run."""
    import numpy as np

    if ref.remake is None:
        return None
    key = id(ref)
    if key in _reorder_cache:
        return _reorder_cache[key][0]
    tmp, tag, n, extra = ref.remake
    def last(flag):
        idx = [i for i, a in enumerate(extra) if a == flag]
        return int(extra[idx[-1] + 1]) if idx else None
    mb, gb = last("--micro-batch-size"), last("--global-batch-size")
    worst = lworst = None
    for k in (2, 4):
        if mb is None or gb is None or gb % (mb * k * n) != 0:
            continue
        other = tiny_run(tmp, f"{tag}-reordered-mb{mb * k}", n, list(extra) + ["--micro-batch-size", str(mb * k)])
        for name, ref_t in ref[1].items():
            a = without_key_bias(name, other[1][name].astype(np.float64))
            b = without_key_bias(name, ref_t.astype(np.float64))
            d = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
            worst = d if worst is None else max(worst, d)
        if len(other[0]) == len(ref[0]):
            ld = max(rel(a, b) for a, b in zip(other[0], ref[0]))
            lworst = ld if lworst is None else max(lworst, ld)
    _reorder_cache[key] = (worst, ref, lworst)  # ref kept alive so that id(ref) stays its own
    return worst


def reorder_loss_noise(ref):
    """The per-step loss's worst relative move under reorder_noise's
    reorderings of ref (measured with it, once a run); None when ref cannot
    be remade so."""
    reorder_noise(ref)
    return _reorder_cache[id(ref)][2] if id(ref) in _reorder_cache else None


def check_export(tag, src, out):
    """One check line: `loom convert` of checkpoint src to the safetensors
    file out gives the tensors assembled from src's pieces, bit for bit."""
    from pyref import ckpt, st

    p = loom("convert", src, out, timeout=300)
    if p.returncode != 0:
        check(f"loom convert of {tag}", False, p.stderr)
        return
    exported, assembled = st.load(out), ckpt.weights(src)
    same = sorted(exported) == sorted(assembled) and all(same_bits(exported[k], assembled[k]) for k in assembled)
    check(f"loom convert of {tag}: the assembled tensors, bit for bit", same)


def same_steps_at_lr0(tag, ref_metrics, got_metrics, loss_tol=1e-5, norm_tol=2e-3):
    """One check line for two 16-bit runs of a mixture of experts at a
    learning rate of 0 (the metrics files of tiny_run's): every step's loss
    within loss_tol and gradient norm within norm_tol relative.

    Why at lr 0: trained, a 16-bit run and its data-parallel twin part. A
    float32 sum in another order flips a 16-bit rounding, and where a
    token's two best experts are that close its routing flips, a discrete
    change that grows from there (mixtral-tiny in bf16: DDP 4 leaves one
    process by 1.2e-3 over 20 steps). At lr 0 every step sees the same
    weights: the loss moves by the reordered sums and the expert products
    over other rows (measured 1.0e-6), and a gradient element by one 16-bit
    rounding of another float32 sum (2^-8 in bf16), the norm by less than
    half of that (measured 1.0e-4). A wrong gradient moves the norm by far
    more."""
    a, b = metrics_rows(ref_metrics), metrics_rows(got_metrics)
    loss = max((rel(x["loss"], y["loss"]) for x, y in zip(b, a)), default=1.0)
    norm = max((rel(x["grad_norm"], y["grad_norm"]) for x, y in zip(b, a)), default=1.0)
    return check(f"{tag} at lr 0: every step's loss within {loss_tol:g} (worst {loss:.1e}) and gradient norm "
                 f"within {norm_tol:g} (worst {norm:.1e})",
                 len(a) == len(b) == STEPS and loss <= loss_tol and norm <= norm_tol)


def same_run(tag, ref, got):
    """One check line: tiny_run's got is ref bit for bit, every step's loss
    and every bit of every final weight (assembled from the ranks)."""
    losses_ref, w_ref, _ = ref
    losses, w, out = got
    diff = differing(w_ref, w)
    ok = len(losses) == STEPS and losses == losses_ref and not diff
    first = next((i + 1 for i, (a, b) in enumerate(zip(losses, losses_ref)) if a != b), None)
    return check(f"{tag:40s} every loss and every weight bit for bit", ok,
                 f"steps {len(losses)}, first differing loss at step {first}, differing tensors {diff[:6]}"
                 f"\n{out[-800:] if len(losses) != STEPS else ''}")


# A mixture of experts routes each token to its top k experts: where a
# token's k-th and (k+1)-th router logits tie to within the float32
# reordering two layouts make (1e-7 of a logit at first, growing as the
# weights part), the two runs route it differently from that step on, a
# discrete change that moves the loss by about one token's share (1e-6 to
# 1e-5) and grows from there. How often depends on the BLAS's rounding: seen
# in 2 of about 40 mixtral-tiny comparisons here, at steps 10 and 19. The
# routing is in the metrics: tokens per expert (min, max, cv) and the
# dropped share come from integer counts, equal to the last digit while the
# routing is the same. MIN_ROUTED_STEPS: the fewest steps compared before a
# routing change for it to count as such a tie (a wrong gradient parts the
# runs' weights, and with them the routing, within a step or two).
MIN_ROUTED_STEPS = 5


def routing_parted(ref, got):
    """The first step (from 1) at which got's experts saw other tokens than
    ref's (tiny_run's metrics: tokens per expert or the dropped share
    differ), and the two values; None without experts or without a change."""
    if not (isinstance(ref, Run) and isinstance(got, Run) and ref.remake and got.remake):
        return None
    rows = [metrics_rows(os.path.join(r.remake[0], f"{r.remake[1]}.jsonl")) for r in (ref, got)]
    for i, (a, b) in enumerate(zip(*rows)):
        if "moe" not in a or "moe" not in b:
            return None
        ka = (a["moe"]["tokens_per_expert"], a["moe"]["dropped_share"])
        kb = (b["moe"]["tokens_per_expert"], b["moe"]["dropped_share"])
        if ka != kb:
            return i + 1, ka, kb
    return None


def compare_runs(tag, ref, got, tol=1e-5, wtol=None, tensor_tol=None):
    """One check line: tiny_run's got against ref, every step's loss within
    tol relative and the final weights within wtol (default tol): the whole
    model's relative L2 error and every tensor's, each tensor's within
    tensor_tol instead when given (a caller that widens it says why), or
    within REORDER_FACTOR times the move the reference's own reordering
    gives (reorder_noise) when that is larger; the losses likewise within
    REORDER_FACTOR times the losses' move under that reordering when that is
    larger than tol (reorder_loss_noise). The whole model's bound is fixed.
    Prints every step's losses on failure. For a mixture of experts whose
    routing parts at a near-tie (routing_parted), the steps before it.

    The default 1e-5 for float32 runs: a layout that only reorders float32
    sums changes each product by a few units of 2^-24 (6e-8) and the loss by
    about 1e-7 after 20 steps (measured: at most 6e-8 for every reordering
    of the 8-layer model in tests/test_pipeline_parallel.py, 7e-7 for the
    whole model's weights), so 1e-5 leaves more than 10x on any machine, and
    a wrong gradient or a lost micro-batch moves both by 1e-3 or more.

    16-bit runs pass tol=1e-4 and wtol=4e-3 (bf16) or 1e-3 (fp16): a float32
    sum in another order that lands on the other side of a 16-bit rounding
    boundary moves that weight or activation by a whole 16-bit step, 2^-8 =
    3.9e-3 of it in bf16 (wtol: one step), 2^-11 = 4.9e-4 in fp16 (wtol:
    two), and the loss follows by far less (measured: 2.8e-5 to 3.0e-5 for
    bf16 in tests/test_bf16_torch.py against PyTorch, whose every sum is in
    another order; 2.4e-4 for fp16's worst tensor in
    tests/test_tensor_parallel.py)."""
    import numpy as np

    losses_ref, w_ref, _ = ref
    losses, w, out = got
    parted = routing_parted(ref, got)
    if parted:  # a router's near-tie (see routing_parted): the steps before it, in full
        n = parted[0] - 1
        worst = max((rel(a, b) for a, b in zip(losses[:n], losses_ref[:n])), default=1.0)
        return check(f"{tag:40s} the routing parted at step {parted[0]} (a near-tie: tokens per expert "
                     f"{parted[1]} vs {parted[2]}); the {n} steps before it: loss max rel err {worst:.2e} "
                     f"(tol {tol:g}, at least {MIN_ROUTED_STEPS} steps)",
                     len(losses) == STEPS and n >= MIN_ROUTED_STEPS and worst <= tol,
                     "\n".join(f"    step {i + 1}: {a:.9f} vs {b:.9f}" for i, (a, b) in enumerate(zip(losses, losses_ref))))
    ok = len(losses) == STEPS
    worst = 0.0
    for a, b in zip(losses, losses_ref):
        worst = max(worst, rel(a, b))
    # Weights: the whole model's relative L2 error, and every tensor's. One
    # slice is left out of the per-tensor check, and said so: the key part of
    # attn.c_attn.bias (see without_key_bias). Adam scales its noise up to
    # steps of size lr, different for any summation order; it is reported,
    # and counted in the whole-model error.
    wworst, wname = 0.0, ""
    num = den = 0.0
    for name, ref_t in w_ref.items():
        got_t = w[name].astype(np.float64)
        ref64 = ref_t.astype(np.float64)
        num += float(np.sum((got_t - ref64) ** 2))
        den += float(np.sum(ref64 ** 2))
        got_t, ref64 = without_key_bias(name, got_t), without_key_bias(name, ref64)
        d = np.linalg.norm(got_t - ref64) / max(np.linalg.norm(ref64), 1e-30)
        if d > wworst:
            wworst, wname = d, name
    whole = (num / den) ** 0.5
    wtol = tol if wtol is None else wtol
    ttol = wtol if tensor_tol is None else tensor_tol
    measured = lmeasured = ""
    ltol = tol
    if (wworst > ttol or worst > tol) and ok and whole <= wtol and isinstance(ref, Run):
        # one tensor, or the loss, past the fixed bound: judge it against this
        # machine's own float32 reordering of the reference (see REORDER_FACTOR)
        noise = reorder_noise(ref)
        if wworst > ttol and noise is not None and REORDER_FACTOR * noise > ttol:
            ttol = REORDER_FACTOR * noise
            measured = f" = {REORDER_FACTOR}x the reference's own reordering"
        lnoise = reorder_loss_noise(ref)
        if worst > tol and lnoise is not None and REORDER_FACTOR * lnoise > tol:
            ltol = REORDER_FACTOR * lnoise
            lmeasured = f", loss {ltol:.2g} = {REORDER_FACTOR}x the reference's own reordering"
    ok = ok and worst <= ltol and whole <= wtol and wworst <= ttol
    wworst = max(wworst, whole)
    buckets = [line for line in out.splitlines() if line.startswith("data parallel")]
    if not check(f"{tag:40s} loss max rel err {worst:.2e}, weights rel L2 whole {whole:.2e}, worst tensor "
                 f"{wworst:.2e} ({wname}) (tol {tol:g}{'' if wtol == tol else f', weights {wtol:g}'}"
                 f"{'' if ttol == wtol else f', a tensor {ttol:.2g}{measured}'}{lmeasured}) "
                 f"{buckets[0] if buckets else ''}", ok):
        for i, (a, b) in enumerate(zip(losses, losses_ref)):
            print(f"    step {i + 1}: {a:.9f} vs {b:.9f}")


# ---- Hugging Face transformers ------------------------------------------------

HF_TRANSFORMERS = "transformers==4.39.3"
HF_VENV = os.path.join(BUILD, "test-venv")
TENSORBOARD = "tensorboard==2.16.2"  # its reader, for tests/test_cli_commands.py
TB_VENV = os.path.join(BUILD, "test-venv-tensorboard")


def use_transformers():
    """Makes `import transformers` work in the calling test: nothing reaches
    the network (every model is made locally), and when this interpreter
    cannot import it the test re-runs itself under hf_python's."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers

        del transformers
    except ImportError:
        py = hf_python()
        if os.path.realpath(sys.prefix) == os.path.realpath(HF_VENV):
            raise SystemExit(f"FAIL: {py} cannot import transformers")
        os.execv(py, [py] + sys.argv)


SPM_SPEC = ["transformers==4.39.3", "sentencepiece==0.2.0", "protobuf==4.25.3"]
SPM_VENV = os.path.join(BUILD, "test-venv-spm")


def use_sentencepiece():
    """Makes `import sentencepiece`, `tokenizers` and `transformers` work in
    the calling test (SPM_SPEC in the test-only venv SPM_VENV, made on first
    use): the test re-runs itself under that venv's Python when this one
    cannot import them."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import sentencepiece
        import tokenizers
        import transformers

        del sentencepiece, tokenizers, transformers
    except ImportError:
        py = venv_python(SPM_VENV, SPM_SPEC, "sentencepiece")
        if os.path.realpath(sys.prefix) == os.path.realpath(SPM_VENV):
            raise SystemExit(f"FAIL: {py} cannot import sentencepiece and transformers")
        os.execv(py, [py] + sys.argv)


def hf_python():
    """A Python that can `import transformers` (HF_TRANSFORMERS from PyPI):
    the test-only virtual environment HF_VENV, made on first use from
    /usr/bin/python3 with the system's packages visible (Debian's torch and
    numpy are reused; pip adds transformers and what it needs). Returns the
    interpreter's path; a failure to make it ends the test as a FAIL, one
    line naming the step (not a skip: the tests that need it cannot run)."""
    return venv_python(HF_VENV, HF_TRANSFORMERS, "transformers")


def venv_python(venv, spec, module):
    """A Python in the test-only virtual environment `venv` (made on first
    use, the system's packages visible) that can `import module`, pip
    installing `spec` (one requirement, or a list) from PyPI; its path, or
    the test ends as a FAIL naming the step that failed."""
    py = os.path.join(venv, "bin", "python3")
    if os.access(py, os.X_OK) and run([py, "-c", f"import {module}"]).returncode == 0:
        return py
    steps = [["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
             [os.path.join(venv, "bin", "pip"), "install", "-q", *([spec] if isinstance(spec, str) else spec)],
             [py, "-c", f"import {module}"]]
    for cmd in steps:
        try:
            p = run(cmd, timeout=1800)
            rc, why = p.returncode, (p.stderr.strip().splitlines() or [""])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            rc, why = None, str(e)
        if rc != 0:
            raise SystemExit(f"FAIL: cannot make the test virtual environment {venv} with {spec}: "
                             f"`{' '.join(cmd)}` exited {rc}: {why}")
    return py
