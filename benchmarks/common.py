"""Shared pieces of the GPU benchmarks: the variants and shapes measured, their attn IR,
random inputs, an independent float32 PyTorch formula of each variant (the correctness
check every timed output passes first), FLOP counts, loading generated Triton source,
timing, and the record of the environment a result was measured in.

The benchmark variants (all with Nq = Nk = N, queries at positions 0..N-1):

- `causal`: plain causal attention.
- `rope_causal`: RoPE (theta 10000, "half" style, rotary_dim = D) on q and k, causal.
- `sliding_window`: causal window of `WINDOW` positions (0 <= q_pos - kv_pos < WINDOW).
  1024 is smaller than every N from 2048 on, so the window bites there, while most KV
  blocks it visits are still full (unmasked): the mix that long-context models with
  windows of 1k-4k (Mistral, Gemma 2) produce.
- `softcap`: scores capped with 50 tanh(s / 50) (Gemma 2's value), then causal.
- `softcap_window`: the same cap, then the causal window (Gemma 2's local layers).
- `alibi`: ALiBi bias slopes[h] * (kv_pos - q_pos) with BLOOM's slopes, then causal.
- `qknorm_rope`: RMSNorm of q and k over the head dim (eps 1e-6, a learned weight per
  channel), then RoPE as in `rope_causal`, causal (Qwen3's pattern).

The shapes: `paper` (B=4, H=12, D=64, fp16, the AttnFuse paper's), `llama`
(B=1, Hq=32, Hkv=8, D=128, bf16, Llama-3-8B's attention) and, only when asked for,
`gemma2` (B=1, Hq=16, Hkv=8, D=256, bf16, Gemma-2-9B's).

Scripts import this file as `common` (they put its folder first on sys.path).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from attnfuse import cache
from attnfuse.runtime import device_sm

WINDOW = 1024
"""Sliding-window width of the `sliding_window` variant (see the module docstring)."""
ROPE_THETA = 10000.0
SOFTCAP = 50.0
NORM_EPS = 1e-6

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)

MLIR_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


@dataclass(frozen=True)
class Shape:
    """Batch, head counts, head dim and element type of one benchmark shape."""

    name: str
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def gqa(self) -> bool:
        return self.q_heads != self.kv_heads

    def describe(self) -> str:
        heads = f"H={self.q_heads}" if not self.gqa else f"Hq={self.q_heads}, Hkv={self.kv_heads}"
        return f"B={self.batch}, {heads}, D={self.head_dim}, {str(self.dtype).removeprefix('torch.')}"


SHAPES = {
    "paper": Shape("paper", 4, 12, 12, 64, torch.float16),
    "llama": Shape("llama", 1, 32, 8, 128, torch.bfloat16),
    # Gemma-2-9B's attention (head dim 256); only when asked for (--shapes gemma2).
    "gemma2": Shape("gemma2", 1, 16, 8, 256, torch.bfloat16),
}
DEFAULT_SHAPES = ("paper", "llama")

# Tiny shapes for --cpu-smoke (the Triton interpreter): fp16, because bf16 tl.dot is
# wrong under the 3.6 interpreter.
SMOKE_SHAPES = {
    "paper": Shape("paper", 1, 2, 2, 32, torch.float16),
    "llama": Shape("llama", 1, 4, 2, 32, torch.float16),
    "gemma2": Shape("gemma2", 1, 4, 2, 64, torch.float16),
}


@dataclass(frozen=True)
class BenchVariant:
    """One benchmark variant: which pre-matmul transforms and score ops it has."""

    name: str
    rope: bool = False
    qknorm: bool = False
    mask: str = "causal"
    """causal or sliding_window."""
    softcap: float | None = None
    alibi: bool = False

    @property
    def has_pre(self) -> bool:
        """Whether q/k are transformed before Q.K^T (what flex and SDPA cannot fuse)."""
        return self.rope or self.qknorm

    @property
    def core(self) -> BenchVariant:
        """The same variant without its pre-matmul transforms."""
        return BenchVariant(self.name + "/core", mask=self.mask, softcap=self.softcap, alibi=self.alibi)

    @property
    def sdpa_expressible(self) -> bool:
        """Whether SDPA's is_causal computes the score part (no bias, cap or window)."""
        return self.mask == "causal" and self.softcap is None and not self.alibi


VARIANTS = {
    v.name: v
    for v in (
        BenchVariant("causal"),
        BenchVariant("rope_causal", rope=True),
        BenchVariant("sliding_window", mask="sliding_window"),
        BenchVariant("softcap", softcap=SOFTCAP),
        BenchVariant("softcap_window", mask="sliding_window", softcap=SOFTCAP),
        BenchVariant("alibi", alibi=True),
        BenchVariant("qknorm_rope", rope=True, qknorm=True),
    )
}


# ----------------------------------------------------------------------------- IR


def mlir_float(x: float) -> str:
    """A float literal MLIR parses (it needs a '.' before any exponent: 1.0e-06)."""
    text = repr(float(x))
    mantissa, _, exp = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + ("e" + exp if exp else "")


def make_ir(variant: BenchVariant, shape: Shape, window: int = WINDOW) -> str:
    """The attn IR (MLIR text) of `variant` at `shape`'s head counts, head dim and dtype.

    Extra arguments after q, k, v: the q and k norm weights ([D], the shape's dtype)
    for `qknorm`, the ALiBi slopes ([Hq] f32) for `alibi`."""
    e = MLIR_DTYPES[shape.dtype]
    d, hq, hkv = shape.head_dim, shape.q_heads, shape.kv_heads
    qt, kt = f"tensor<?x{hq}x?x{d}x{e}>", f"tensor<?x{hkv}x?x{d}x{e}>"
    st, pt = f"!attn.scores<{hq}>", f"!attn.probs<{hq}>"
    args = [f"%q: {qt}", f"%k: {kt}", f"%v: {kt}"]
    body: list[str] = []
    q, k = "%q", "%k"
    if variant.qknorm:
        args += [f"%qw: tensor<{d}x{e}>", f"%kw: tensor<{d}x{e}>"]
        body.append(f"%qn = attn.norm {q} eps = {mlir_float(NORM_EPS)} weight(%qw : tensor<{d}x{e}>) : {qt}")
        body.append(f"%kn = attn.norm {k} eps = {mlir_float(NORM_EPS)} weight(%kw : tensor<{d}x{e}>) : {kt}")
        q, k = "%qn", "%kn"
    if variant.rope:
        body.append(f"%qr = attn.rope {q} half theta = {mlir_float(ROPE_THETA)} rotary_dim = {d} : {qt}")
        body.append(f"%kr = attn.rope {k} half theta = {mlir_float(ROPE_THETA)} rotary_dim = {d} : {kt}")
        q, k = "%qr", "%kr"
    body.append(f"%s0 = attn.qk {q}, {k} : {qt}, {kt} -> {st}")
    s = "%s0"
    if variant.softcap is not None:
        body.append(f"%sc = attn.softcap {s} cap = {mlir_float(variant.softcap)} : {st}")
        s = "%sc"
    if variant.alibi:
        args.append(f"%slopes: tensor<{hq}xf32>")
        body.append(f"%sb = attn.bias {s} alibi(%slopes : tensor<{hq}xf32>) : {st}")
        s = "%sb"
    pred = "causal" if variant.mask == "causal" else f"sliding_window({window})"
    body.append(f"%sm = attn.mask {s} {pred} : {st}")
    body.append(f"%p = attn.softmax %sm : {st} -> {pt}")
    body.append(f"%o = attn.pv %p, %v : {pt}, {kt} -> {qt}")
    lines = "\n".join("  " + line for line in body)
    return f"func.func @{variant.name}({', '.join(args)}) -> {qt} {{\n{lines}\n  func.return %o : {qt}\n}}\n"


# ----------------------------------------------------------------------------- inputs


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """BLOOM's ALiBi slopes, float32 [n_heads] (2^(-8 i / n) for a power-of-two n;
    otherwise those of the largest power of two p < n, then every other slope of 2p)."""
    p = 1 << (n_heads.bit_length() - 1)
    slopes = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    slopes += [2.0 ** (-8.0 * (i + 1) / (2 * p)) for i in range(0, 2 * p, 2)][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


@dataclass
class Inputs:
    """q [B, Hq, N, D], k and v [B, Hkv, N, D], and the variant's extra tensors."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    extras: list[torch.Tensor]

    @property
    def args(self) -> list[torch.Tensor]:
        return [self.q, self.k, self.v, *self.extras]

    def to(self, device: str | torch.device) -> Inputs:
        return Inputs(*(x.to(device) for x in (self.q, self.k, self.v)), [x.to(device) for x in self.extras])


def make_inputs(variant: BenchVariant, shape: Shape, n: int, device: str | torch.device, seed: int) -> Inputs:
    """Fresh standard-normal q, k, v of `shape` with N = `n`, plus the variant's extras
    (norm weights near 1, ALiBi slopes), on `device`."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    b, hq, hkv, d = shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=g, dtype=torch.float32).to(device=device, dtype=shape.dtype)

    q, k, v = randn(b, hq, n, d), randn(b, hkv, n, d), randn(b, hkv, n, d)
    extras: list[torch.Tensor] = []
    if variant.qknorm:
        extras += [(1 + 0.2 * randn(d).float()).to(shape.dtype) for _ in range(2)]
    if variant.alibi:
        extras.append(alibi_slopes(hq).to(device))
    return Inputs(q, k, v, extras)


# ----------------------------------------------------------------------------- the formula


def rope_tables(
    n: int, dim: int, device: str | torch.device, theta: float = ROPE_THETA, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32 [n, dim / 2], of positions start..start+n-1 for half-style
    RoPE with rotary_dim = dim (angles computed in float64)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    pos = torch.arange(start, start + n, dtype=torch.float64)
    angle = (pos[:, None] * inv_freq[None, :]).to(device)
    return torch.cos(angle).float(), torch.sin(angle).float()


def rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-style rotation of float32 x [..., N, D] by float32 cos/sin [N, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """RMSNorm over the last dim, in float32."""
    x = x.float()
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * weight.float()


def keep_mask(variant: BenchVariant, nq: int, nk: int, device: str | torch.device, window: int) -> torch.Tensor:
    """Bool [Nq, Nk]: which scores the variant's mask keeps (queries = the last Nq positions)."""
    q_pos = torch.arange(nk - nq, nk, device=device)[:, None]
    kv_pos = torch.arange(nk, device=device)[None, :]
    dist = q_pos - kv_pos
    if variant.mask == "causal":
        return dist >= 0
    return (dist >= 0) & (dist < window)


def reference_formula(
    variant: BenchVariant, inputs: Inputs, *, window: int = WINDOW, chunk_bytes: float = 2e9
) -> torch.Tensor:
    """The variant's output [B, Hq, Nq, D] in float32, written directly in PyTorch
    (independent of the attn reference executor and of the compiler), a few heads at a
    time so that the [heads, Nq, Nk] score block stays under `chunk_bytes`. Matmuls run
    in full float32 (TF32 is switched off here)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    q, k, v = inputs.q.float(), inputs.k.float(), inputs.v.float()
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    extras = list(inputs.extras)
    if variant.qknorm:
        wq, wk = extras.pop(0), extras.pop(0)
        q, k = rms_norm(q, wq), rms_norm(k, wk)
    if variant.rope:
        cos_k, sin_k = rope_tables(nk, d, q.device)
        q = rope_half(q, cos_k[nk - nq :], sin_k[nk - nq :])
        k = rope_half(k, cos_k, sin_k)
    slopes = extras.pop(0).float() if variant.alibi else None
    masked = ~keep_mask(variant, nq, nk, q.device, window)
    rel = None
    if slopes is not None:  # kv_pos - q_pos
        rel = (torch.arange(nk, device=q.device)[None, :] - torch.arange(nk - nq, nk, device=q.device)[:, None]).float()
    group = hq // hkv
    heads_per_chunk = max(1, min(hq, int(chunk_bytes // (4 * nq * nk))))
    out = torch.empty(b, hq, nq, v.shape[-1], dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d)
    for bi in range(b):
        for h0 in range(0, hq, heads_per_chunk):
            hs = torch.arange(h0, min(h0 + heads_per_chunk, hq), device=q.device)
            kvh = hs // group
            s = q[bi, hs] @ k[bi, kvh].transpose(-1, -2) * scale
            if variant.softcap is not None:
                s = variant.softcap * torch.tanh(s / variant.softcap)
            if slopes is not None:
                s = s + slopes[hs][:, None, None] * rel
            s = s.masked_fill(masked, float("-inf"))
            out[bi, hs] = torch.softmax(s, dim=-1) @ v[bi, kvh]
            del s
    return out


@dataclass
class Check:
    """How an output compares with the float32 formula."""

    ok: bool
    max_abs: float
    rel_l2: float
    excess: float
    """max(|out - ref| - rtol |ref|): the check passes when this is <= atol."""

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "max_abs": self.max_abs, "rel_l2": self.rel_l2}


ATOL = 2e-2
RTOL = 2e-2


def compare(out: torch.Tensor, ref: torch.Tensor, atol: float = ATOL, rtol: float = RTOL) -> Check:
    """Compare an output with the float32 reference: it passes when every element is
    finite and |out - ref| <= atol + rtol |ref| (16-bit outputs, fp32 accumulation)."""
    if tuple(out.shape) != tuple(ref.shape):
        return Check(False, float("inf"), float("inf"), float("inf"))
    o = out.float()
    finite = bool(torch.isfinite(o).all())
    diff = (o - ref).abs()
    max_abs = float(diff.max()) if finite else float("nan")
    excess = float((diff - rtol * ref.abs()).max()) if finite else float("nan")
    rel_l2 = float(torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref)) if finite else float("nan")
    return Check(finite and excess <= atol, max_abs, rel_l2, excess)


# ----------------------------------------------------------------------------- FLOPs


def unmasked_pairs(variant: BenchVariant, nq: int, nk: int, window: int) -> float:
    """Number of (query, key) pairs the FLOP count charges: Nq Nk / 2 for causal (the
    usual convention), the exact count of kept pairs for a sliding window."""
    if variant.mask == "causal":
        return nq * nk / 2
    first = nk - nq  # position of query 0
    total = 0
    for i in range(nq):  # kept keys of query i: positions max(0, p - w + 1)..p, p = first + i
        p = first + i
        total += min(p + 1, window)
    return float(total)


def attention_flops(variant: BenchVariant, shape: Shape, nq: int, nk: int, window: int = WINDOW) -> float:
    """Forward FLOPs: 4 B Hq D per kept (query, key) pair (two matmuls)."""
    return 4.0 * shape.batch * shape.q_heads * shape.head_dim * unmasked_pairs(variant, nq, nk, window)


def tflops(flops: float, ms: float | None) -> float | None:
    return None if not ms else flops * 1e-12 / (ms * 1e-3)


# ----------------------------------------------------------------------------- generated source


_SOURCE_DIR: Path | None = None


def source_dir() -> Path:
    """The temporary folder generated kernels are written to (one per process)."""
    global _SOURCE_DIR
    if _SOURCE_DIR is None:
        _SOURCE_DIR = Path(tempfile.mkdtemp(prefix="attnfuse_bench_"))
    return _SOURCE_DIR


def load_source(source: str, *, interpret: bool = False) -> ModuleType:
    """Import generated kernel source as a module (`attnfuse.cache.load_source`, once per
    text). With `interpret`, the script must have set TRITON_INTERPRET=1 before importing
    triton (as every `--cpu-smoke` run does): the interpreter reads it while kernels run."""
    return cache.load_source(source, source_dir(), interpret=interpret)


@dataclass(frozen=True)
class KernelJob:
    """One AttnFuse compilation: a benchmark variant at a shape, compiled with
    `compile_module(sm=sm, seq_len=seq_len, **options)`."""

    variant: str
    shape: Shape
    seq_len: int
    sm: int
    window: int = WINDOW
    options: tuple[tuple[str, Any], ...] = ()
    """Pipeline options (rope_mode, block_m, ...) as sorted (name, value) pairs."""

    @staticmethod
    def make(variant: str, shape: Shape, seq_len: int, sm: int, window: int = WINDOW, **options: Any) -> KernelJob:
        return KernelJob(variant, shape, seq_len, sm, window, tuple(sorted(options.items())))

    def compile(self) -> tuple[str, dict]:
        """(source, launch_params)."""
        from attnfuse.compiler import compile_module
        from attnfuse.ir import parse_module

        module = parse_module(make_ir(VARIANTS[self.variant], self.shape, self.window))
        compiled = compile_module(module, sm=self.sm, seq_len=self.seq_len, **dict(self.options))
        return compiled.source, compiled.launch_params


@dataclass(frozen=True)
class Built:
    """The outcome of a KernelJob: its source and launch parameters, or why not."""

    source: str | None
    launch_params: dict | None
    error: str = ""
    """'' when compile_module worked and (where it was tried) the warm-up launch ran."""


def _error_text(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:500] if text else ''}"


def build(job: KernelJob) -> Built:
    """Compile `job` to Triton source (no Triton compilation yet)."""
    try:
        source, params = job.compile()
    except Exception as e:  # noqa: BLE001 - reported with the row
        return Built(None, None, f"compile_module: {_error_text(e)}")
    return Built(source, params)


def warm_up(source: str, variant: str, shape: Shape) -> str:
    """Run the source's kernels once on small CUDA inputs (N=256), which compiles them
    into Triton's on-disk cache; '' or the error. Kernels are specialised on
    16-divisibility of their integer arguments, not on N's value, so the timed runs at
    any N that is a multiple of 16 then only load the binaries."""
    try:
        module = load_source(source)
        inputs = make_inputs(VARIANTS[variant], shape, 256, "cuda", seed=0)
        module.launch(*inputs.args)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001 - the timed run meets it again and records it
        return f"warm-up launch: {_error_text(e)}"


def build_all(jobs: Sequence[KernelJob], workers: int, timeout_s: float = 240.0) -> dict[KernelJob, Built]:
    """Build every job. With CUDA, in `workers` spawned processes and two rounds:
    compile_module for every job, then one warm-up launch per distinct source (Triton's
    compiler, the slow part, runs once per kernel and in parallel). Whatever the pool
    does not finish within `timeout_s`, or everything when there is no GPU or the pool
    breaks, is compiled in this process without warm-up (Triton then compiles at the
    first timed call)."""
    import concurrent.futures as cf
    import dataclasses
    import multiprocessing as mp

    unique = list(dict.fromkeys(jobs))
    built: dict[KernelJob, Built] = {}
    t0 = time.time()
    warmed = 0
    if unique and workers > 0 and torch.cuda.is_available():
        ex = cf.ProcessPoolExecutor(max_workers=min(workers, len(unique)), mp_context=mp.get_context("spawn"))
        try:
            futures = {ex.submit(build, j): j for j in unique}
            for f in cf.as_completed(futures, timeout=timeout_s):
                built[futures[f]] = f.result()
            first: dict[str, KernelJob] = {}
            for j, b in built.items():
                if b.source is not None:
                    first.setdefault(b.source, j)
            warm = {ex.submit(warm_up, src, j.variant, j.shape): src for src, j in first.items()}
            errors: dict[str, str] = {}
            for f in cf.as_completed(warm, timeout=max(1.0, timeout_s - (time.time() - t0))):
                errors[warm[f]] = f.result()
                warmed += 1
            for j, b in built.items():
                if errors.get(b.source or ""):
                    built[j] = dataclasses.replace(b, error=errors[b.source])
        except Exception as e:  # noqa: BLE001 - a broken pool or a timeout only costs time
            log(f"build_all: pool stopped after {time.time() - t0:.0f}s ({_error_text(e)}); compiling the rest here")
        finally:
            ex.shutdown(wait=False, cancel_futures=True)
    for j in unique:
        if j not in built:
            built[j] = build(j)
    failed = sum(1 for b in built.values() if b.error)
    log(
        f"build_all: {len(unique)} jobs, {len({b.source for b in built.values()} - {None})} distinct sources, "
        f"{warmed} warmed up in {workers} workers, {time.time() - t0:.1f}s, {failed} with errors"
    )
    return built


# ----------------------------------------------------------------------------- timing


def bench(fn: Callable[[], Any], *, warmup: int = 25, rep: int = 100) -> float:
    """Median time of fn() in ms: triton.testing.do_bench (CUDA events, L2 flushed
    between runs) on a GPU; without one (--cpu-smoke, the Triton interpreter), the
    wall-clock time of one run: it only shows that the path works."""
    if torch.cuda.is_available():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def raise_recompile_limits() -> None:
    """torch.compile falls back to eager after 8 recompiles of one function; every
    (N, mask) pair of the benchmark is one, so raise the limits."""
    import torch._dynamo.config as cfg

    for name, value in (
        ("recompile_limit", 1024),
        ("cache_size_limit", 1024),
        ("accumulated_recompile_limit", 4096),
        ("accumulated_cache_size_limit", 4096),
    ):
        if hasattr(cfg, name):
            setattr(cfg, name, value)


def add_measurement_args(ap: argparse.ArgumentParser) -> None:
    """The options every measuring script shares: precompile workers, --cpu-smoke, do_bench
    settings, the output check's tolerances and --verbose."""
    ap.add_argument("--workers", type=int, default=12, help="processes that precompile the AttnFuse kernels")
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="no GPU: tiny shapes, generated kernels under the Triton interpreter"
    )
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetitions, ms")
    ap.add_argument("--atol", type=float, default=ATOL)
    ap.add_argument("--rtol", type=float, default=RTOL)
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing measurements")


# ----------------------------------------------------------------------------- records


def init_distributed(smoke: bool) -> torch.device:
    """The torchrun process's device and its process group: NCCL on its local GPU, or gloo on
    the CPU with `smoke` or without CUDA; a 300 s timeout (a rank that fails stops the others
    in minutes, not NCCL's default half hour)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=300)
    if torch.cuda.is_available() and not smoke:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
        return device
    dist.init_process_group("gloo", timeout=timeout)
    return torch.device("cpu")


def log(msg: str) -> None:
    print(msg, flush=True)


def environment() -> dict[str, Any]:
    """GPU, clocks, driver and library versions, date: stored with every result."""
    import triton

    env: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            sm=device_sm(),
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            cudnn=torch.backends.cudnn.version(),
        )
    env["nvidia_smi"] = nvidia_smi()
    return env


def nvidia_smi() -> str:
    """`nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,...` (CSV), or why not."""
    try:
        r = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version,power.limit,temperature.gpu",
                "--format=csv",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return (r.stdout or r.stderr).strip()
    except Exception as e:  # noqa: BLE001
        return f"nvidia-smi unavailable: {e}"


class GpuSampler:
    """The SM clock and the power draw of torch's current GPU, sampled every `period_ms` by
    `nvidia-smi -lms` in a background process between `start()` and `stop()`. `stop()` gives the
    median clock (MHz), the mean power (W) and the number of samples, or, with no samples, why
    (no nvidia-smi: on the CPU). A row whose kernels slow the clocks for the work after them shows
    it here, where its time alone cannot."""

    def __init__(self, period_ms: int = 50):
        self.period_ms = period_ms
        self.proc: subprocess.Popen[str] | None = None
        self.error = "not started"

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=uuid,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                 "-lms", str(self.period_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        except OSError as e:
            self.error = f"nvidia-smi unavailable: {e}"

    def stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {"gpu_samples": 0, "gpu_sampler": self.error}
        self.proc.terminate()
        out, err = self.proc.communicate(timeout=30)
        self.proc = None
        by_gpu: dict[str, list[tuple[float, float]]] = {}
        for line in out.splitlines():
            parts = [x.strip() for x in line.split(",")]
            try:
                by_gpu.setdefault(parts[0], []).append((float(parts[1]), float(parts[2])))
            except (IndexError, ValueError):  # "[N/A]", or a line cut by the termination
                continue
        ours = f"GPU-{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"
        samples = by_gpu.get(ours) or (next(iter(by_gpu.values())) if len(by_gpu) == 1 else [])
        if not samples:
            why = f"GPUs {sorted(by_gpu)} sampled, none is torch's {ours}" if by_gpu else err.strip() or "no samples"
            return {"gpu_samples": 0, "gpu_sampler": why[:200]}
        return {
            "gpu_samples": len(samples),
            "sm_mhz_median": sorted(c for c, _ in samples)[len(samples) // 2],
            "power_w_mean": sum(w for _, w in samples) / len(samples),
        }


def write_json(path: Path, obj: Any) -> None:
    """Write JSON through a temporary file and a rename (a killed run leaves the last
    complete file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def env_markdown(env: dict[str, Any]) -> str:
    """The environment as a few markdown lines."""
    lines = [
        f"- date (UTC): {env.get('date_utc')}",
        f"- GPU: {env.get('gpu', 'none')} (sm {env.get('sm', '-')}, {env.get('multiprocessors', '-')} SMs)",
        f"- torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda')}, "
        f"cuDNN {env.get('cudnn', '-')}",
    ]
    smi = env.get("nvidia_smi", "")
    if smi:
        lines.append("- nvidia-smi: " + " | ".join(smi.splitlines()))
    return "\n".join(lines) + "\n"


def fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def progress(items: Iterable[Any], total: int, desc: str) -> Iterator[Any]:
    """Iterate with a progress bar: tqdm when it is installed, else a printed counter."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        yield from tqdm(items, total=total, desc=desc, file=sys.stdout, mininterval=1.0, dynamic_ncols=False, ncols=100)
        return
    for i, item in enumerate(items, 1):
        log(f"[{desc}] {i}/{total}")
        yield item
