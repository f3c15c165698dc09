"""Training attention on the GPU: forward + backward and backward alone of AttnFuse against
compiled flex_attention and SDPA's flash and cuDNN backends, each peer with a separate RoPE
(and QK-norm) whose backward is part of its autograd graph, per variant, shape and N.

    python benchmarks/bench_backward.py --out DIR [--quick] [--shapes llama] [--ns 4096,16384]
    python benchmarks/bench_backward.py --out DIR --cpu-smoke     # no GPU: interpreter, tiny shapes

Variants (rows), all causal with Nq = Nk = N:

- `causal`: plain causal attention;
- `rope_causal`: RoPE on q and k, then causal. Paper shape: theta 10000, no scaling (as in
  bench_forward). Llama shape: `attnfuse.variants.llama3` (theta 500000, Llama 3.1's
  frequency scaling: factor 8, low/high frequency factors 1 and 4, original context 8192);
- `qknorm_rope`: `attnfuse.variants.qwen3`: RMSNorm of q and k with learned weights
  (eps 1e-6), then RoPE (theta 1e6), causal. The norm weights require grad too (unless
  `--frozen-norm-weights`), so every implementation also computes their gradients.

Implementations (JSON key `impl`):

- `attnfuse`: the variant called as a user would, `out = variant(q, k, v, *extras)` with
  inputs that require grad, then `out.backward(dout)`: plain torch autograd.
- `flex` / `rope+flex`: `flex_attention` compiled as in bench_forward (`torch.compile`,
  `dynamic=False` unless `--flex-dynamic`) with a causal BlockMask, GQA through
  `enable_gqa`; for the RoPE variants after the separate pre-transform.
- `sdpa_flash`, `sdpa_cudnn` / `rope+sdpa_...`: `scaled_dot_product_attention(is_causal=True)`
  under `sdpa_kernel(<backend>)`, GQA through `enable_gqa` (or k/v expanded with
  repeat_interleave where the backend refuses it, noted in the row).
- The peers' pre-transform (RoPE; RMSNorm + RoPE for qknorm_rope) is a function in float32
  compiled per shape (`torch.compile(dynamic=False)`), differentiated by autograd: its
  backward kernels are timed with the attention's. On a RoPE variant only the `rope+`
  peers are measured; the plain peers are the `causal` rows of the same shape and N.

Modes, each a `triton.testing.do_bench` median (L2 flushed between runs) in one process:

- `fwd`: the forward with gradients enabled (it saves what the backward needs);
- `fwdbwd`: forward, then `out.backward(dout)`, the inputs' `.grad` set to None first
  (fresh gradients every run, no accumulation kernels);
- `bwd`: the backward alone: one forward, then `out.backward(dout, retain_graph=True)`
  replayed on that graph (grads set to None before each run). This times exactly the
  backward kernels and autograd's dispatch, whatever the forward does differently when it
  saves tensors. `bwd_sub_ms` = fwdbwd - fwd is recorded as a cross-check (what
  /work/shared/gpu/anchors_bwd.py reported, with a no-grad forward). Where a graph cannot be
  replayed, `bwd_ms` is that difference and `bwd_method` says so.

FLOPs (as in the anchors): forward 4 B Hq N^2 D / 2 (causal), backward 2.5x, fwd+bwd 3.5x.

Memory: `peak_mib` = torch.cuda.max_memory_allocated during one forward + backward (stats
reset just before) less what was allocated before it (inputs, dout, references): the
activations, saved tensors, workspaces and gradients of one training step of the layer.

Correctness, before any timing: the output and the gradients of q, k, v (and of the norm
weights) of every implementation are compared with an independent float32 PyTorch
formula (RMSNorm, RoPE from its own inverse frequencies, attention a few heads at a time,
differentiated by autograd): relative L2 error <= `--grad-tol` (default 2e-2) for each
gradient, and |out - ref| <= 2e-2 + 2e-2 |ref| for the output. A failing row is WRONG
and its times are kept under `*_unchecked` only.

Results: DIR/backward.json (rows + environment, rewritten after every case),
DIR/backward.csv (one line per row), DIR/backward.md (tables per shape and variant with
the ratios against rope+cuDNN and rope+flex), also printed at the end.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--cpu-smoke" in sys.argv:
    # Library jit functions (tl.cdiv, ...) are interpretable only when triton itself was
    # imported with TRITON_INTERPRET=1, so it must be set before anything imports triton.
    import os

    os.environ["TRITON_INTERPRET"] = "1"

import common as C  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnfuse as af  # noqa: E402

VARIANTS = ("rope_causal", "causal", "qknorm_rope")
"""Measured variants, most important first (what the time budget leaves out is last)."""
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
QUICK_NS = (1024, 4096, 16384)
SMOKE_NS = (80,)
GRAD_TOL = 2e-2
MODES = ("fwd", "fwdbwd", "bwd")
FLOP_FACTOR = {"fwd": 1.0, "fwdbwd": 3.5, "bwd": 2.5}


# ----------------------------------------------------------------------------- variants


@af.variant
def af_causal(q, k, v):
    """Plain causal attention."""
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def af_rope_causal(q, k, v):
    """RoPE (theta 10000, half style, all channels) on q and k, causal: bench_forward's rope_causal."""
    q = af.rope(q, theta=C.ROPE_THETA)
    k = af.rope(k, theta=C.ROPE_THETA)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@dataclass(frozen=True)
class Rope:
    """The RoPE of a row: theta and whether Llama 3.1's frequency scaling applies."""

    theta: float
    llama3: bool = False


@dataclass(frozen=True)
class Row:
    """One measured (variant, shape): its RoPE (None for plain causal) and QK-norm."""

    name: str
    shape: C.Shape
    rope: Rope | None
    qknorm: bool

    @property
    def bench_variant(self) -> C.BenchVariant:
        return C.VARIANTS[self.name]

    def attnfuse(self) -> Any:
        """The AttnFuse variant computing this row."""
        from attnfuse import variants

        if self.qknorm:
            return variants.qwen3
        if self.rope is None:
            return af_causal
        return variants.llama3 if self.rope.llama3 else af_rope_causal


def make_row(name: str, shape: C.Shape) -> Row:
    if name == "causal":
        return Row(name, shape, None, False)
    if name == "qknorm_rope":
        return Row(name, shape, Rope(1e6), True)  # Qwen3's theta
    if shape.name == "llama":
        return Row(name, shape, Rope(500000.0, llama3=True), False)
    return Row(name, shape, Rope(C.ROPE_THETA), False)


def inv_freq(rope: Rope, dim: int) -> torch.Tensor:
    """float64 [dim / 2] inverse frequencies, written here independently of attnfuse.rope_freqs
    (Llama 3.1's scaling as in transformers' `_compute_llama3_parameters`)."""
    freq = 1.0 / rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if not rope.llama3:
        return freq
    factor, low, high, old = 8.0, 1.0, 4.0, 8192.0
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > old / low, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(rope: Rope, n: int, dim: int, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin [n, dim / 2] of positions 0..n-1 (angles in float64)."""
    angle = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq(rope, dim)[None, :]
    return torch.cos(angle).float().to(device), torch.sin(angle).float().to(device)


def pre_rope(q, k, cos, sin):
    """The peers' separate RoPE: float32 rotation, back to the input dtype."""
    return C.rope_half(q.float(), cos, sin).to(q.dtype), C.rope_half(k.float(), cos, sin).to(k.dtype)


def pre_norm_rope(q, k, wq, wk, cos, sin):
    """The peers' separate QK-norm (RMSNorm with weights, float32) then RoPE."""
    q2 = C.rope_half(C.rms_norm(q, wq), cos, sin).to(q.dtype)
    k2 = C.rope_half(C.rms_norm(k, wk), cos, sin).to(k.dtype)
    return q2, k2


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


# ----------------------------------------------------------------------------- inputs and reference


@dataclass
class Case:
    """The tensors of one (row, N): leaves that require grad, dout, the RoPE tables."""

    row: Row
    n: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    weights: list[torch.Tensor]
    dout: torch.Tensor
    cos: torch.Tensor | None
    sin: torch.Tensor | None

    @property
    def leaves(self) -> dict[str, torch.Tensor]:
        """The tensors whose gradients are computed and checked, by name."""
        named = {"q": self.q, "k": self.k, "v": self.v}
        named.update({f"w{x}": w for x, w in zip("qk", self.weights, strict=False) if w.requires_grad})
        return named

    def clear_grads(self) -> None:
        for t in (self.q, self.k, self.v, *self.weights):
            t.grad = None


def make_case(row: Row, n: int, device: str, seed: int, frozen_weights: bool = False) -> Case:
    """Fresh inputs (common.make_inputs), all requiring grad, and a standard-normal dout."""
    inputs = C.make_inputs(row.bench_variant, row.shape, n, device, seed)
    q, k, v = (x.requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    weights = [w.requires_grad_(not frozen_weights) for w in inputs.extras] if row.qknorm else []
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    dout = torch.randn(q.shape, generator=g, dtype=torch.float32).to(device=device, dtype=q.dtype)
    cos = sin = None
    if row.rope is not None:
        cos, sin = rope_tables(row.rope, n, row.shape.head_dim, device)
    return Case(row, n, q, k, v, weights, dout, cos, sin)


@dataclass
class Reference:
    """The float32 output and gradients (by leaf name) of a case."""

    out: torch.Tensor
    grads: dict[str, torch.Tensor]


def _attention_grads(q2, k2, v, dout, chunk_bytes: float) -> tuple[torch.Tensor, ...]:
    """Causal attention of float32 q2 [B, Hq, N, D], k2, v [B, Hkv, N, D]: (out, dq2, dk2, dv),
    a few heads at a time (autograd per chunk, TF32 off), so the [heads, N, N] scores of a
    chunk stay under `chunk_bytes`."""
    torch.backends.cuda.matmul.allow_tf32 = False
    b, hq, n, d = q2.shape
    group = hq // k2.shape[1]
    out, dq, dk, dv = torch.empty_like(q2), torch.zeros_like(q2), torch.zeros_like(k2), torch.zeros_like(v)
    masked = ~C.keep_mask(C.VARIANTS["causal"], n, n, q2.device, 0)
    per_chunk = max(1, min(hq, int(chunk_bytes // (4 * n * n))))
    for bi in range(b):
        for h0 in range(0, hq, per_chunk):
            hs = torch.arange(h0, min(h0 + per_chunk, hq), device=q2.device)
            kvh = hs // group
            qc, kc, vc = (x.requires_grad_() for x in (q2[bi, hs], k2[bi, kvh], v[bi, kvh]))
            with torch.enable_grad():
                s = (qc @ kc.transpose(-1, -2) / math.sqrt(d)).masked_fill(masked, float("-inf"))
                o = torch.softmax(s, dim=-1) @ vc
                o.backward(dout[bi, hs])
            out[bi, hs] = o.detach()
            dq[bi, hs] = qc.grad
            dk[bi].index_add_(0, kvh, kc.grad)
            dv[bi].index_add_(0, kvh, vc.grad)
            del s, o, qc, kc, vc
    return out, dq, dk, dv


def reference(case: Case, chunk_bytes: float = 1e9) -> Reference:
    """The case's float32 output and gradients: the pre-transform by autograd in float32, the
    attention by `_attention_grads`, chained."""
    leaves32 = {name: t.detach().float().requires_grad_() for name, t in case.leaves.items()}
    q, k, v = leaves32["q"], leaves32["k"], leaves32["v"]
    weights = [leaves32.get(f"w{x}", w.detach().float()) for x, w in zip("qk", case.weights, strict=False)]
    with torch.enable_grad():
        q2, k2 = q, k
        if case.row.qknorm:
            q2, k2 = C.rms_norm(q2, weights[0]), C.rms_norm(k2, weights[1])
        if case.cos is not None:
            q2, k2 = C.rope_half(q2, case.cos, case.sin), C.rope_half(k2, case.cos, case.sin)
    out, dq2, dk2, dv = _attention_grads(q2.detach(), k2.detach(), v.detach(), case.dout.float(), chunk_bytes)
    grads = {"v": dv}
    if q2 is q:
        grads.update(q=dq2, k=dk2)
    else:
        torch.autograd.backward((q2, k2), (dq2, dk2))
        grads.update({name: t.grad for name, t in leaves32.items() if name != "v"})
    return Reference(out, grads)


def check(out: torch.Tensor, case: Case, ref: Reference, tol: float, atol: float, rtol: float) -> dict[str, Any]:
    """The output against the reference (common.compare) and each leaf's gradient by its
    relative L2 error; ok when the output passes and every error is finite and <= tol."""
    out_check = C.compare(out.detach(), ref.out, atol, rtol)
    rel: dict[str, float] = {}
    missing = []
    for name, leaf in case.leaves.items():
        if leaf.grad is None:
            missing.append(name)
            continue
        g, r = leaf.grad.float(), ref.grads[name]
        err = torch.linalg.vector_norm(g - r) / torch.linalg.vector_norm(r).clamp_min(1e-30)
        rel[name] = float(err) if bool(torch.isfinite(g).all()) else float("nan")
    worst = max(rel.values(), default=float("nan"))
    ok = out_check.ok and not missing and all(x <= tol for x in rel.values())  # nan fails
    result = {
        "ok": ok,
        "out_max_abs": out_check.max_abs,
        "out_rel_l2": out_check.rel_l2,
        "grad_rel_l2": rel,
        "grad_rel_l2_max": worst,
    }
    if missing:
        result["missing_grads"] = missing
    return result


# ----------------------------------------------------------------------------- implementations


class Peers:
    """The compiled peer functions, built once so that torch.compile's guards see the same
    Python objects in every case (each new shape is one recompile)."""

    def __init__(self, device: str, compiled: bool, flex_dynamic: bool):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.device = device
        self.create_block_mask = create_block_mask
        if compiled:
            C.raise_recompile_limits()
            self.flex = torch.compile(flex_attention, dynamic=flex_dynamic)
            self.pre_rope = torch.compile(pre_rope, dynamic=False)
            self.pre_norm_rope = torch.compile(pre_norm_rope, dynamic=False)
        else:  # --cpu-smoke: eager (the same formulas), unfused on purpose
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            self.flex, self.pre_rope, self.pre_norm_rope = flex_attention, pre_rope, pre_norm_rope
        self._masks: dict[int, Any] = {}

    def block_mask(self, n: int) -> Any:
        if n not in self._masks:
            self._masks[n] = self.create_block_mask(_causal, None, None, n, n, device=self.device)
        return self._masks[n]

    def pre(self, case: Case) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """q and k after the row's pre-transform (themselves for plain causal)."""
        q, k, cos, sin = case.q, case.k, case.cos, case.sin
        if case.row.qknorm:
            wq, wk = case.weights
            return lambda: self.pre_norm_rope(q, k, wq, wk, cos, sin)
        if case.row.rope is not None:
            return lambda: self.pre_rope(q, k, cos, sin)
        return lambda: (q, k)

    def implementations(self, case: Case, interpret: bool) -> dict[str, tuple[Callable[[], torch.Tensor], dict]]:
        """name -> (fn() -> out, extra row fields) of every implementation of the case."""
        prefix = "rope+" if case.row.rope is not None else ""
        pre, v, gqa = self.pre(case), case.v, case.row.shape.gqa
        impls: dict[str, tuple[Callable[[], torch.Tensor], dict]] = {"attnfuse": (attnfuse_fn(case, interpret), {})}
        if interpret:  # the differentiable reference executor: exercises the checks before the kernels' backward
            impls["attnfuse_reference"] = (attnfuse_fn(case, interpret, backend="reference"), {})
        if not interpret:  # flex_attention has no backward on CPU
            flex, bm = self.flex, self.block_mask(case.n)
            impls[prefix + "flex"] = (lambda: flex(*pre(), v, block_mask=bm, enable_gqa=gqa), {})
        from torch.nn.attention import SDPBackend

        backends = (
            {"sdpa_math": SDPBackend.MATH}
            if interpret
            else {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
        )
        for name, backend in backends.items():
            fn, gqa_note = sdpa_fn(backend, pre, case)
            impls[prefix + name] = (fn, {"gqa": gqa_note} if gqa else {})
        return impls


def attnfuse_fn(case: Case, interpret: bool, backend: str | None = None) -> Callable[[], torch.Tensor]:
    """The AttnFuse variant called on the case's leaves (interpreter backend under --cpu-smoke)."""
    variant, args = case.row.attnfuse(), (case.q, case.k, case.v, *case.weights)
    name = backend or ("interpret" if interpret else None)
    if name is None:
        return lambda: variant(*args)

    def run() -> torch.Tensor:
        with af.backend(name):
            return variant(*args)

    return run


def sdpa_fn(backend: Any, pre: Callable, case: Case) -> tuple[Callable[[], torch.Tensor], str]:
    """SDPA under `sdpa_kernel(backend)` after `pre`, and how GQA is handled ('none',
    'enable_gqa', or 'repeat_interleave' where the backend refuses enable_gqa)."""
    from torch.nn.attention import sdpa_kernel

    v, gqa, group = case.v, case.row.shape.gqa, case.row.shape.q_heads // case.row.shape.kv_heads
    note = _sdpa_gqa_mode(backend, case) if gqa else "none"
    if note == "repeat_interleave":

        def fn() -> torch.Tensor:
            q2, k2 = pre()
            with sdpa_kernel([backend]):
                k3, v3 = k2.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
                return F.scaled_dot_product_attention(q2, k3, v3, is_causal=True)

        return fn, note

    def fn_gqa() -> torch.Tensor:
        q2, k2 = pre()
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q2, k2, v, is_causal=True, enable_gqa=gqa)

    return fn_gqa, note


def _sdpa_gqa_mode(backend: Any, case: Case) -> str:
    """'enable_gqa' when the backend runs forward and backward with it, else 'repeat_interleave'."""
    from torch.nn.attention import sdpa_kernel

    q, k, v = (x.detach()[:, :, :128].clone().requires_grad_() for x in (case.q, case.k, case.v))
    try:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.sum().backward()
        return "enable_gqa"
    except Exception:  # noqa: BLE001
        return "repeat_interleave"


# ----------------------------------------------------------------------------- measuring


class Runner:
    """Checks, measures and records the implementations of one (row, N) case."""

    def __init__(self, args: argparse.Namespace, peers: Peers):
        self.args = args
        self.peers = peers
        self.interpret = args.cpu_smoke
        self.rows: list[dict[str, Any]] = []

    def case(self, row: Row, n: int, seed: int) -> None:
        device = "cpu" if self.interpret else "cuda"
        case = make_case(row, n, device, seed, self.args.frozen_norm_weights)
        t0 = time.time()
        ref = reference(case)
        C.synchronize()
        C.log(f"    float32 reference: {time.time() - t0:.1f}s")
        flops = C.attention_flops(row.bench_variant, row.shape, n, n)
        base = {"shape": row.shape.name, "variant": row.name, "n": n, "flops": flops}
        if row.rope is not None:
            base["rope"] = {"theta": row.rope.theta, "scaling": "llama3" if row.rope.llama3 else None}
        for impl, (fn, extra) in self.peers.implementations(case, self.interpret).items():
            self.measure({**base, **extra}, impl, fn, case, ref, flops)
            C.synchronize()
        del ref

    def measure(
        self, base: dict[str, Any], impl: str, fn: Callable[[], torch.Tensor], case: Case, ref: Reference, flops: float
    ) -> dict[str, Any]:
        """Check fn's output and gradients, then its peak memory and the three timings; one row."""
        row: dict[str, Any] = {**base, "impl": impl}
        t0 = time.time()
        try:
            case.clear_grads()
            out = fn()
            out.backward(case.dout)
            C.synchronize()
            row["first_call_s"] = round(time.time() - t0, 3)
            row.update(check(out, case, ref, self.args.grad_tol, self.args.atol, self.args.rtol))
            del out
            row["peak_mib"] = peak_memory(fn, case)
            times = self.timings(fn, case)
            suffix = "" if row["ok"] else "_unchecked"
            for mode, ms in times.items():
                if mode == "bwd_method":
                    row[mode] = ms
                    continue
                row[f"{mode}_ms{suffix}"] = ms
                if row["ok"] and mode in FLOP_FACTOR:
                    row[f"{mode}_tflops"] = C.tflops(FLOP_FACTOR[mode] * flops, ms)
            row["status"] = "ok" if row["ok"] else "WRONG"
        except Exception as e:  # noqa: BLE001 - one failing implementation must not stop the run
            row.update(ok=False, status="ERROR", error=f"{type(e).__name__}: {e}"[:2000])
            if self.args.verbose:
                traceback.print_exc()
        finally:
            case.clear_grads()
        row["wall_s"] = round(time.time() - t0, 2)
        self.rows.append(row)
        log_row(row)
        return row

    def timings(self, fn: Callable[[], torch.Tensor], case: Case) -> dict[str, Any]:
        """fwd (grad enabled), fwd+bwd (fresh grads) and bwd alone (a retained graph
        replayed; fwd+bwd - fwd where that fails), ms."""
        warmup, rep = self.args.warmup, self.args.rep

        def fwdbwd() -> None:
            case.clear_grads()
            fn().backward(case.dout)

        t = {"fwd": C.bench(fn, warmup=warmup, rep=rep), "fwdbwd": C.bench(fwdbwd, warmup=warmup, rep=rep)}
        t["bwd_sub"] = t["fwdbwd"] - t["fwd"]
        try:
            out = fn()

            def bwd() -> None:
                case.clear_grads()
                out.backward(case.dout, retain_graph=True)

            t["bwd"], t["bwd_method"] = C.bench(bwd, warmup=warmup, rep=rep), "retain_graph"
        except Exception as e:  # noqa: BLE001 - recorded: the difference stands in
            t["bwd"], t["bwd_method"] = t["bwd_sub"], f"difference ({type(e).__name__})"
        return t


def peak_memory(fn: Callable[[], torch.Tensor], case: Case) -> float | None:
    """MiB allocated at the peak of one forward + backward above what was allocated before it."""
    if not torch.cuda.is_available():
        return None
    case.clear_grads()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    out.backward(case.dout)
    del out
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    case.clear_grads()
    return peak / 2**20


def log_row(row: dict[str, Any]) -> None:
    if row["status"] == "ERROR":
        C.log(f"    {row['impl']:22s} ERROR  {row['error'].splitlines()[0][:300]}")
        return
    sfx = "" if row["ok"] else "_unchecked"
    times = "  ".join(f"{m} {C.fmt(row.get(f'{m}_ms{sfx}'))} ms ({C.fmt(row.get(f'{m}_tflops'), 0)})" for m in MODES)
    mem = f"{row['peak_mib']:.0f} MiB" if row.get("peak_mib") is not None else "- MiB"
    C.log(
        f"    {row['impl']:22s} {row['status']:6s} {times}  {mem}  grad rel_l2 max {row['grad_rel_l2_max']:.1e}  "
        f"({row['wall_s']:.1f}s)"
    )


# ----------------------------------------------------------------------------- warm-up


def warm_case(job: tuple[str, str, int, bool, bool]) -> tuple[str, str, int, dict[str, str], float]:
    """In a worker process: run every implementation of one case once (forward and
    backward), which fills Triton's, Inductor's and AttnFuse's on-disk caches; the timed
    process then loads the kernels instead of compiling them. Returns the errors by impl."""
    vname, sname, n, flex_dynamic, frozen = job
    t0 = time.time()
    errors: dict[str, str] = {}
    try:
        row = make_row(vname, C.SHAPES[sname])
        case = make_case(row, n, "cuda", seed=0, frozen_weights=frozen)
        peers = Peers("cuda", compiled=True, flex_dynamic=flex_dynamic)
        for impl, (fn, _) in peers.implementations(case, interpret=False).items():
            try:
                case.clear_grads()
                fn().backward(case.dout)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - the timed run meets it again and records it
                errors[impl] = f"{type(e).__name__}: {str(e)[:300]}"
    except Exception as e:  # noqa: BLE001
        errors["case"] = f"{type(e).__name__}: {str(e)[:300]}"
    return vname, sname, n, errors, time.time() - t0


def warm_up(cases: list[tuple[Row, int]], args: argparse.Namespace, timeout_s: float) -> None:
    """`warm_case` for every case in `args.workers` spawned processes, within `timeout_s`
    (what does not finish then is compiled by the timed process at its first call)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    if args.workers <= 0 or not cases or not torch.cuda.is_available():
        return
    t0 = time.time()
    jobs = [(r.name, r.shape.name, n, args.flex_dynamic, args.frozen_norm_weights) for r, n in cases]
    ex = cf.ProcessPoolExecutor(max_workers=min(args.workers, len(jobs)), mp_context=mp.get_context("spawn"))
    done = 0
    try:
        for f in cf.as_completed([ex.submit(warm_case, j) for j in jobs], timeout=timeout_s):
            vname, sname, n, errors, took = f.result()
            done += 1
            note = "; ".join(f"{k}: {v.splitlines()[0][:120]}" for k, v in errors.items())
            C.log(f"  warm-up {vname}/{sname}/{n}: {took:.0f}s{'  ' + note if note else ''}")
    except Exception as e:  # noqa: BLE001 - a broken pool or a timeout only costs time
        C.log(f"warm-up stopped after {time.time() - t0:.0f}s: {type(e).__name__}: {e}")
    finally:
        # Workers still compiling after the timeout would compete with the timed runs: end them.
        for p in list(getattr(ex, "_processes", {}).values()):
            p.terminate()
        ex.shutdown(wait=False, cancel_futures=True)
    C.log(f"warm-up: {done}/{len(jobs)} cases in {args.workers} workers, {time.time() - t0:.0f}s")


# ----------------------------------------------------------------------------- tables


PEER_ORDER = ("flex", "sdpa_flash", "sdpa_cudnn", "sdpa_math")


def columns(variant: str, present: set[str]) -> list[str]:
    """The implementations of a table in display order."""
    prefix = "" if variant == "causal" else "rope+"
    order = ["attnfuse", "attnfuse_reference", *(prefix + p for p in PEER_ORDER)]
    return [i for i in order if i in present]


def ratio_peers(variant: str) -> list[tuple[str, str]]:
    """(impl, label) the ratios are taken against: rope+cuDNN and rope+flex (cuDNN and flex
    for plain causal; the math backend under --cpu-smoke)."""
    prefix = "" if variant == "causal" else "rope+"
    return [
        (prefix + "sdpa_cudnn", prefix + "cuDNN"),
        (prefix + "flex", prefix + "flex"),
        (prefix + "sdpa_math", "math"),
    ]


def time_cell(row: dict[str, Any] | None, mode: str) -> str:
    if row is None:
        return "—"
    if row["status"] != "ok":
        return row["status"]
    ms, tf = row.get(f"{mode}_ms"), row.get(f"{mode}_tflops")
    return "—" if ms is None else f"{ms:.3f} ({tf:.0f})" if tf is not None else f"{ms:.3f}"


def ratio(ours: dict[str, Any] | None, theirs: dict[str, Any] | None, key: str, invert: bool = False) -> str:
    a = (ours or {}).get(key) if (ours or {}).get("status") == "ok" else None
    b = (theirs or {}).get(key) if (theirs or {}).get("status") == "ok" else None
    if not a or not b:
        return "—"
    return f"{(a / b) if invert else (b / a):.2f}"


def mode_table(sel: list[dict[str, Any]], variant: str, mode: str, label: str) -> list[str]:
    """One markdown table: N, the implementations' ms (TFLOP/s) in `mode`, the speed-ups."""
    present = columns(variant, {r["impl"] for r in sel})
    peers = [(k, lab) for k, lab in ratio_peers(variant) if k in present]
    head = ["N", *present, *(f"× vs {lab}" for _, lab in peers)]
    lines = [f"\n{label}\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in sorted({r["n"] for r in sel}):
        by = {r["impl"]: r for r in sel if r["n"] == n}
        cells = [str(n), *(time_cell(by.get(i), mode) for i in present)]
        cells += [ratio(by.get("attnfuse"), by.get(k), f"{mode}_ms") for k, _ in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def memory_table(sel: list[dict[str, Any]], variant: str) -> list[str]:
    """Peak MiB of one fwd+bwd per implementation, AttnFuse's against the cuDNN path, and the
    largest gradient error of each implementation."""
    present = columns(variant, {r["impl"] for r in sel})
    cudnn = ("" if variant == "causal" else "rope+") + "sdpa_cudnn"
    head = ["N", *(f"{i} MiB" for i in present)]
    head += ["attnfuse / cuDNN"] if cudnn in present else []
    head += [f"{i} grad err" for i in present]
    lines = ["\nPeak memory of one fwd+bwd (MiB above the inputs) and max gradient rel. L2 error\n"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in sorted({r["n"] for r in sel}):
        by = {r["impl"]: r for r in sel if r["n"] == n}
        cells = [str(n), *(C.fmt((by.get(i) or {}).get("peak_mib"), 0) for i in present)]
        if cudnn in present:
            cells.append(ratio(by.get("attnfuse"), by.get(cudnn), "peak_mib", invert=True))
        cells += [_err_cell(by.get(i)) for i in present]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _err_cell(row: dict[str, Any] | None) -> str:
    if row is None or row["status"] == "ERROR":
        return "—" if row is None else "ERROR"
    return f"{row['grad_rel_l2_max']:.1e}" + ("" if row["ok"] else " WRONG")


def markdown(rows: list[dict[str, Any]], env: dict[str, Any], shapes: dict[str, C.Shape]) -> str:
    out = [
        "# Training attention: AttnFuse forward + backward vs flex_attention and SDPA\n",
        C.env_markdown(env),
        "\nCells: median ms (TFLOP/s; fwd+bwd counts 3.5x the causal forward FLOPs, bwd 2.5x). "
        "× = peer ms / AttnFuse ms (> 1: AttnFuse is faster); memory: AttnFuse / cuDNN (< 1: AttnFuse "
        "uses less). `rope+X`: the peer after a separate RoPE (QK-norm + RoPE for qknorm_rope) compiled per "
        "shape, whose backward is part of the timed graph. bwd alone: the backward replayed on a retained "
        "graph. WRONG: output or a gradient failed the check against the float32 formula (time not valid). "
        "Errors are in backward.json.\n",
    ]
    for shape in shapes.values():
        for vname in VARIANTS:
            sel = [r for r in rows if r.get("shape") == shape.name and r.get("variant") == vname and "impl" in r]
            if not sel:
                continue
            rope = next((r.get("rope") for r in sel if r.get("rope")), None)
            what = f", RoPE theta {rope['theta']:g}{' llama3 scaling' if rope.get('scaling') else ''}" if rope else ""
            out.append(f"\n## {shape.name} ({shape.describe()}), {vname}{what}\n")
            out += mode_table(sel, vname, "fwdbwd", "Forward + backward")
            out += mode_table(sel, vname, "bwd", "Backward alone")
            out += mode_table(sel, vname, "fwd", "Forward (gradients enabled)")
            out += memory_table(sel, vname)
    return "\n".join(out) + "\n"


CSV_FIELDS = (
    "shape variant n impl status ok fwd_ms fwdbwd_ms bwd_ms bwd_sub_ms fwd_tflops fwdbwd_tflops bwd_tflops "
    "bwd_method peak_mib grad_rel_l2_max out_rel_l2 first_call_s gqa error"
).split()


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(
                {k: (str(r[k]).splitlines()[0][:200] if k == "error" and r.get(k) else r.get(k)) for k in CSV_FIELDS}
            )


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path, help="folder for backward.json, .csv and .md")
    ap.add_argument("--quick", action="store_true", help=f"N in {QUICK_NS}")
    ap.add_argument("--variants", default=None, help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of paper,llama,gemma2 (default paper,llama)")
    ap.add_argument("--ns", default=None, help=f"comma-separated sequence lengths (default {SEQ_LENS})")
    ap.add_argument("--skip", default="", help="comma-separated shape:N cases to leave out, e.g. paper:16384")
    ap.add_argument("--grad-tol", type=float, default=GRAD_TOL, help="largest relative L2 error of a gradient")
    ap.add_argument("--frozen-norm-weights", action="store_true", help="qknorm_rope's norm weights do not require grad")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting new cases after this many seconds")
    ap.add_argument("--flex-dynamic", action="store_true", help="compile flex with dynamic=True instead of False")
    C.add_measurement_args(ap)
    ap.set_defaults(workers=8)
    return ap.parse_args(argv)


def selection(args: argparse.Namespace) -> list[tuple[Row, int]]:
    """The (row, N) cases in measuring order: variant, then shape, then N."""

    def pick(text: str | None, default: tuple, known: tuple | None, what: str) -> list[str]:
        names = default if text is None else tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in names if known is not None and x not in known]
        if bad:
            raise SystemExit(f"unknown {what} {', '.join(bad)}; expected some of {', '.join(known or ())}")
        return list(names)

    vnames = [v for v in VARIANTS if v in pick(args.variants, VARIANTS, VARIANTS, "variant")]
    all_shapes = C.SMOKE_SHAPES if args.cpu_smoke else C.SHAPES
    snames = pick(args.shapes, C.DEFAULT_SHAPES, tuple(all_shapes), "shape")
    default_ns = SMOKE_NS if args.cpu_smoke else QUICK_NS if args.quick else SEQ_LENS
    ns = [int(x) for x in pick(args.ns, tuple(map(str, default_ns)), None, "N")]
    skip = {tuple(x.split(":")) for x in args.skip.split(",") if x}
    return [(make_row(v, all_shapes[s]), n) for v in vnames for s in snames for n in ns if (s, str(n)) not in skip]


def result(args: argparse.Namespace, env: dict, rows: list, skipped: list, t_start: float) -> dict[str, Any]:
    return {
        "environment": env,
        "args": {k: str(x) for k, x in vars(args).items()},
        "elapsed_s": round(time.time() - t_start, 1),
        "skipped_for_budget": skipped,
        "rows": rows,
    }


def run_cases(runner: Runner, cases: list[tuple[Row, int]], t_start: float, write: Callable[[list], None]) -> list:
    """Measure every case (until the time budget is spent), writing the results after each."""
    skipped: list[str] = []
    for i, (row, n) in enumerate(cases, 1):
        elapsed = time.time() - t_start
        if elapsed > runner.args.budget_s:
            skipped.append(f"{row.name}/{row.shape.name}/{n}")
            continue
        C.log(f"[{i}/{len(cases)}] {row.name} {row.shape.name} N={n}  (elapsed {elapsed:.0f}s)")
        t_case = time.time()
        try:
            runner.case(row, n, seed=1000 * i + n)
        except Exception as e:  # noqa: BLE001
            runner.rows.append(
                {"shape": row.shape.name, "variant": row.name, "n": n, "impl": "case", "status": "ERROR", "ok": False}
                | {"error": f"{type(e).__name__}: {e}"[:2000]}
            )
            C.log(f"    case failed: {type(e).__name__}: {e}")
            if runner.args.verbose:
                traceback.print_exc()
        C.log(f"    case took {time.time() - t_case:.1f}s")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        write(skipped)
    return skipped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("bench_backward needs a CUDA GPU (or --cpu-smoke)")
    t_start = time.time()
    cases = selection(args)
    env = C.environment()
    C.log(f"bench_backward: {len(cases)} cases, {env.get('gpu', 'cpu')}, torch {env['torch']}, triton {env['triton']}")
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = {r.shape.name: r.shape for r, _ in cases}
    if not args.cpu_smoke:
        warm_up(cases, args, timeout_s=max(60.0, args.budget_s / 3))
    runner = Runner(args, Peers("cpu" if args.cpu_smoke else "cuda", not args.cpu_smoke, args.flex_dynamic))
    paths = {ext: args.out / f"backward.{ext}" for ext in ("json", "csv", "md")}

    def write(skipped: list[str]) -> None:
        C.write_json(paths["json"], result(args, env, runner.rows, skipped, t_start))
        write_csv(paths["csv"], runner.rows)
        paths["md"].write_text(markdown(runner.rows, env, shapes))

    skipped = run_cases(runner, cases, t_start, write)
    write(skipped)
    C.log("\n" + paths["md"].read_text())
    if skipped:
        C.log(f"budget of {args.budget_s:.0f}s reached: skipped {len(skipped)} cases: {', '.join(skipped)}")
    bad = [r for r in runner.rows if r.get("status") in ("WRONG", "ERROR")]
    C.log(
        f"bench_backward done in {time.time() - t_start:.0f}s: {len(runner.rows)} rows, {len(bad)} WRONG/ERROR; "
        f"wrote {', '.join(map(str, paths.values()))}"
    )
    for r in bad:
        err = (r.get("error") or "").splitlines()[0][:200] if r.get("error") else ""
        dev = f" grad rel_l2={r['grad_rel_l2']}" if r.get("grad_rel_l2") else ""
        C.log(f"  {r['status']}: {r['shape']}/{r['variant']}/N={r['n']}/{r['impl']} {err}{dev}")
    return smoke_status(runner.rows) if args.cpu_smoke else 0


NO_BACKWARD_YET = "has no backward yet"
"""The runtime's refusal while the kernels have no backward: the only error --cpu-smoke tolerates."""


def smoke_status(rows: list[dict[str, Any]]) -> int:
    """--cpu-smoke's exit status: 1 when a row is WRONG or failed for another reason than
    AttnFuse's kernels having no backward yet (so CI sees the script rot), else 0."""
    bad = [r for r in rows if r.get("status") != "ok" and NO_BACKWARD_YET not in (r.get("error") or "")]
    pending = len([r for r in rows if NO_BACKWARD_YET in (r.get("error") or "")])
    if pending:
        C.log(f"--cpu-smoke: {pending} AttnFuse rows refused: the interpreter's kernels have no backward yet")
    if bad:
        C.log(f"--cpu-smoke: {len(bad)} rows WRONG or failing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
