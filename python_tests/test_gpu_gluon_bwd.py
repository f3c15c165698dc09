"""The sm90 Gluon backward (kernel path `gluon-sm90` on a backward function) on a Hopper GPU:
for every variant family of the Gluon forward's suite (`test_gpu_gluon.CASES`: causal and no
mask at head dims 128 and 64, RoPE + causal with GQA, QK-norm + RoPE with learned weights, an
interleaved RoPE, windows, prefix-LM, softcap, ALiBi, sinks, documents, a score_mod, a custom
mask whose first row keeps no key), bf16 and fp16, the generated backward module runs the Gluon
kernel (a counting wrapper around `_gluon_backward`) and its gradients of q, k, v and every
extra that has one match float64 autograd of the reference executor, as relative L2 errors
(`test_gpu_grad.GRAD_TOL`). Calls the Gluon kernel does not cover (N not a multiple of 128,
Nq != Nk) take the generic kernels of the same module and are checked too; transposed views
(the Hugging Face layout) take the Gluon kernels, read in place. Lengths of one to five blocks of
keys and Nk - Nq at offsets across a tile are swept. dQ comes by TMA reduce-adds (kernel-path
`dq-reduce`, the default); the ordered dQ kernel (`dq-reduce=false`, and what a call under
`torch.use_deterministic_algorithms` takes) is as accurate and gives bitwise equal gradients run
after run.

Marked `gpu`; skipped without CUDA and on GPUs other than sm 90.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from test_gpu_gluon import CASES, _inputs, _ir
from test_gpu_grad import GRAD_TOL

from attnfuse.cache import load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.passes.analysis import analyse
from attnfuse.passes.attn_autodiff import differentiable_args
from attnfuse.reference import run_reference
from attnfuse.runtime import device_sm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.is_available() and device_sm() != 90, reason="the Gluon kernel is sm 90's"),
]

MIN_LEN = 256  # the Gluon kernels from N = 256 here, so the float64 reference stays small


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu_gluon_bwd")


BWD_HEAD_DIMS = (64, 128)  # the head dims the Gluon backward takes (kernel-path)


def _modules(
    ir: str, folder: Path, n: int, gluon_bwd: bool = True, **options
) -> tuple[ModuleType, ModuleType, list[int]]:
    module = parse_module(ir)
    wrt = sorted(differentiable_args(analyse(next(iter(module.ops)))))  # type: ignore[arg-type]
    opts = dict(gluon_min_len=MIN_LEN, gluon_min_len_transformed=MIN_LEN, gluon_head_dims=BWD_HEAD_DIMS) | options
    fwd = compile_module(module, sm=90, seq_len=n, **opts).source
    bwd = compile_module(module, sm=90, seq_len=n, direction="bwd", wrt=tuple(wrt), **opts).source
    assert ("_gluon_backward(" in bwd) is gluon_bwd
    return load_source(fwd, folder, interpret=False), load_source(bwd, folder, interpret=False), wrt


class _Counting:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _run(fwd: ModuleType, bwd: ModuleType, args: list[torch.Tensor], seed: int = 99):
    cuda = [a.cuda() for a in args]
    out, lse = fwd.launch(*cuda)
    g = torch.Generator().manual_seed(seed)
    dout = torch.randn(out.shape, generator=g).to(out.dtype).cuda()
    grads = bwd.launch(*cuda, out, lse, dout)
    torch.cuda.synchronize()
    return out, dout, grads


def _check(ir: str, args: list[torch.Tensor], wrt: list[int], out, dout, grads) -> None:
    dtype = args[0].dtype
    xs = [a.double().requires_grad_() if a.is_floating_point() else a for a in args]
    ref = run_reference(ir, *xs, compute_dtype=torch.float64)
    refs = torch.autograd.grad(ref, [xs[i] for i in wrt], dout.cpu().double())
    for i, g, r in zip(wrt, grads, refs, strict=True):
        assert g.shape == args[i].shape and g.dtype == args[i].dtype, f"gradient {i}: {g.shape} {g.dtype}"
        g = g.detach().cpu().double()
        assert torch.isfinite(g).all(), f"gradient of argument {i}: non-finite values"
        err = ((g - r).norm() / r.norm().clamp_min(1e-30)).item()
        assert err < GRAD_TOL[dtype], f"gradient of argument {i}: relative L2 error {err:.2e}"


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[3] in BWD_HEAD_DIMS])
def test_gluon_backward_gradients(name: str, folder: Path) -> None:
    case = CASES[name]
    b, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    n = 1024 if "document" not in name else 2048  # the documents' cuts reach 1500
    fwd, bwd, wrt = _modules(ir, folder, n)
    counting = _Counting(bwd._gluon_backward)
    bwd._gluon_backward = counting
    args = _inputs(case, n, n)
    out, dout, grads = _run(fwd, bwd, args)
    assert counting.calls == 1, "the Gluon backward did not run"
    _check(ir, args, wrt, out, dout, grads)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[3] not in BWD_HEAD_DIMS])
def test_other_head_dims_differentiate_the_gluon_forward_by_the_generic_backward(name: str, folder: Path) -> None:
    """Head dim 256: the Gluon forward (its lse) with the generic backward kernels."""
    case = CASES[name]
    b, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    fwd, bwd, wrt = _modules(ir, folder, 1024, gluon_bwd=False, gluon_head_dims=(64, 128, 256))
    assert hasattr(fwd, "_gluon_attention")  # the module carries the Gluon forward
    args = _inputs(case, 1024, 1024)
    out, dout, grads = _run(fwd, bwd, args)
    _check(ir, args, wrt, out, dout, grads)


SWEEP = ["causal-d64-f16", "rope-causal-d64-f16", "window-f16", "prefix-lm-bf16", "gemma2-rope-softcap-window-bf16"]


@pytest.mark.parametrize("n", [256, 384, 640])
@pytest.mark.parametrize("name", SWEEP)
def test_lengths_around_the_tiles(name: str, n: int, folder: Path) -> None:
    """The Gluon backward at the shortest lengths it takes: one or two blocks of keys per
    program row, the window's and the prefix's edges inside and across the 64-row steps."""
    case = CASES[name]
    b, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    fwd, bwd, wrt = _modules(ir, folder, 1024)
    counting = _Counting(bwd._gluon_backward)
    bwd._gluon_backward = counting
    args = _inputs(case, n, n)
    out, dout, grads = _run(fwd, bwd, args)
    assert counting.calls == 1, "the Gluon backward did not run"
    _check(ir, args, wrt, out, dout, grads)


@pytest.mark.parametrize("shift", [1, 63, 64, 127, 129])
def test_fewer_queries_at_every_offset_take_the_generic_kernels(shift: int, folder: Path) -> None:
    """Nk - Nq across a tile: the Gluon backward takes Nq = Nk only; the module's generic
    kernels compute the rest."""
    case = CASES["rope-causal-d128-bf16"]
    b, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    fwd, bwd, wrt = _modules(ir, folder, 1024)
    counting = _Counting(bwd._gluon_backward)
    bwd._gluon_backward = counting
    args = _inputs(case, 512 - shift, 512)
    out, dout, grads = _run(fwd, bwd, args)
    assert counting.calls == 0
    _check(ir, args, wrt, out, dout, grads)


@pytest.mark.parametrize("nq,nk", [(1000, 1000), (512, 1024)], ids=["n-1000", "nq-512-nk-1024"])
def test_uncovered_calls_take_the_generic_kernels(nq: int, nk: int, folder: Path) -> None:
    case = CASES["rope-causal-d128-bf16"]
    b, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    fwd, bwd, wrt = _modules(ir, folder, 1024)
    counting = _Counting(bwd._gluon_backward)
    bwd._gluon_backward = counting
    args = _inputs(case, nq, nk)
    out, dout, grads = _run(fwd, bwd, args)
    assert counting.calls == 0
    _check(ir, args, wrt, out, dout, grads)


@pytest.mark.parametrize(
    "name,reduce",
    [("causal-d128-bf16", True), ("rope-causal-d128-bf16", True), ("rope-causal-d128-bf16", False)],
    ids=["causal-d128-bf16", "rope-causal-d128-bf16", "rope-causal-d128-bf16-ordered"],
)
def test_transposed_views_take_the_gluon_backward(name: str, reduce: bool, folder: Path) -> None:
    """The Hugging Face layout: q, k, v (and dout) as [B, N, H, D] tensors transposed to
    [B, H, N, D] views. The Gluon backward reads them in place (TMA views of [B * N, H * D]) and
    lays the gradients out in the same order, as SDPA does; with the ordered dQ kernel too."""
    case = CASES[name]
    b, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    n = 1024
    fwd, bwd, wrt = _modules(ir, folder, n, gluon_dq_reduce=reduce)
    counting = _Counting(bwd._gluon_backward)
    bwd._gluon_backward = counting
    args = _inputs(case, n, n)
    views = [x.transpose(1, 2).contiguous().cuda().transpose(1, 2) for x in args[:3]]
    assert not any(x.is_contiguous() for x in views)
    out, lse = fwd.launch(*views)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype)
    dout = dout.transpose(1, 2).contiguous().cuda().transpose(1, 2)
    grads = bwd.launch(*views, out, lse, dout)
    torch.cuda.synchronize()
    assert counting.calls == 1, "the Gluon backward did not run"
    assert all(g.transpose(1, 2).is_contiguous() for g in grads[:3])
    _check(ir, args, wrt, out, dout, grads)


AT_POSITIONS = """
func.func @f(%q: {q}, %k: {kv}, %v: {kv}, %qp: tensor<?x?xi64>, %kp: tensor<?xi32>) -> {q} {{
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = {d} positions(%qp : tensor<?x?xi64>) : {q}
  %kr = attn.rope %k half theta = 500000.0 rotary_dim = {d} positions(%kp : tensor<?xi32>) : {kv}
  %s = attn.qk %qr, %kr : {q}, {kv} -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, {kv} -> {q}
  func.return %o : {q}
}}
"""
"""Llama-3-style RoPE at explicit positions, 8 query heads over 2 kv heads, bf16, at head dim {d}."""


@pytest.mark.parametrize("d", [128, 64])
def test_rope_at_explicit_positions(d: int, folder: Path) -> None:
    """RoPE at explicit positions (q's [B, N], each sequence at its own offset, as transformers'
    position_ids of a shard; k's [N], reversed): the launcher's per-call cos/sin tables, read by
    the Gluon forward's Q prologue, the pre-rotations, the dK/dV kernel (which at head dim 64
    rotates the keys itself) and the kernels that finish dQ and dK; the output and the gradients
    against float64."""
    n, b = 1024, 2
    ir = AT_POSITIONS.format(q=f"tensor<?x8x?x{d}xbf16>", kv=f"tensor<?x2x?x{d}xbf16>", d=d)
    fwd, bwd, wrt = _modules(ir, folder, n)
    counting = _Counting(bwd._gluon_backward)
    bwd._gluon_backward = counting
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(b, h, n, d, generator=g).to(torch.bfloat16) for h in (8, 2, 2)]
    qp = torch.arange(n)[None, :] + torch.tensor([[0], [70000]])
    kp = torch.arange(n - 1, -1, -1, dtype=torch.int32) * 3
    args = [*xs, qp, kp]
    fwd_calls = _Counting(fwd._gluon_attention)
    fwd._gluon_attention = fwd_calls
    out, dout, grads = _run(fwd, bwd, args)
    assert fwd_calls.calls == 1 and "rotate_q" not in Path(fwd.__file__).read_text(), "Q's RoPE: the Gluon kernel's"
    assert counting.calls == 1, "the Gluon backward did not run"
    ref = run_reference(ir, *args, compute_dtype=torch.float64)
    err = ((out.double().cpu() - ref).abs() - 3e-2 * ref.abs()).max().item()
    assert err <= 3e-2, f"output: max |out - ref| - tol |ref| = {err:.3e}"
    _check(ir, args, wrt, out, dout, grads)


@pytest.mark.parametrize(
    "name", ["rope-causal-d128-bf16", "rope-causal-d64-f16", "qknorm-rope-d64-f16", "gemma2-rope-softcap-window-bf16"]
)
def test_the_ordered_dq_kernel(name: str, folder: Path) -> None:
    """kernel-path dq-reduce=false: dQ by the ordered dQ kernel after the dK/dV kernel (which, for
    a K chain of one RoPE at head dim 64, rotates the keys itself and stores them for the ordered
    kernel)."""
    case = CASES[name]
    b, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    n = 1024
    fwd, bwd, wrt = _modules(ir, folder, n, gluon_dq_reduce=False)
    assert "reduce_dq=not _gl_deterministic()" not in Path(bwd.__file__).read_text()
    args = _inputs(case, n, n)
    out, dout, grads = _run(fwd, bwd, args)
    _check(ir, args, wrt, out, dout, grads)


@pytest.mark.parametrize("reduce", [False, True], ids=["ordered", "reduce-under-torch-deterministic"])
def test_gradients_are_bitwise_reproducible(reduce: bool, folder: Path) -> None:
    """Five runs of the same backward give bitwise equal gradients: the ordered dQ
    (dq-reduce=false), and the default (dq-reduce) under `torch.use_deterministic_algorithms(True)`
    (it then takes the ordered dQ kernel); they agree with the reduce-add dQ to rounding."""
    case = CASES["rope-causal-d128-bf16"]
    b, hq, hkv, d, dtype, pieces, _ = case
    ir = _ir(hq, hkv, d, dtype, pieces)
    n = 2048
    args = _inputs(case, n, n)
    fwd, ordered, _ = _modules(ir, folder, n, gluon_dq_reduce=False)
    _, reducing, _ = _modules(ir, folder, n)
    assert "reduce_dq=not _gl_deterministic()" in Path(reducing.__file__).read_text()
    _, _, reduced_grads = _run(fwd, reducing, args)
    if reduce:
        torch.use_deterministic_algorithms(True)
        try:
            runs = [_run(fwd, reducing, args)[2] for _ in range(5)]
        finally:
            torch.use_deterministic_algorithms(False)
    else:
        runs = [_run(fwd, ordered, args)[2] for _ in range(5)]
    for later in runs[1:]:
        for g0, g in zip(runs[0], later, strict=True):
            assert torch.equal(g0, g)
    for g0, g in zip(runs[0], reduced_grads, strict=True):
        err = ((g0.double() - g.double()).norm() / g.double().norm()).item()
        assert err < 1e-2
