"""GPU tests of the backward kernels (run on the lent H200; skipped without CUDA).

Every variant family of the forward GPU suite (`test_gpu.FAMILIES`: causal, sliding window,
prefix-LM, softcap, ALiBi, sinks, document mask, QK-norm + RoPE, partial interleaved RoPE),
plus a custom score_mod and fewer queries than keys, in bf16 and fp16: the generated
backward's gradients (of q, k, v and every extra that has one: sinks, QK-norm weights)
against float64 autograd of the reference executor on the CPU, as relative L2 errors
(issue 11: fp16 6e-3; bf16 keeps 3 fewer mantissa bits).

    python -m pytest -m gpu python_tests/test_gpu_grad.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_gpu import CAUSAL, DTYPES, FAMILIES, HKV, HQ, ROPE, B, D, build_ir, randn

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
]

GRAD_TOL = {torch.float16: 6e-3, torch.bfloat16: 3e-2}

SCORE_MOD = (
    "attn.score_mod {s} {\n"
    "  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):\n"
    "    %c = arith.constant 20.0 : f32\n"
    "    %y = arith.divf %x, %c : f32\n"
    "    %t = math.tanh %y : f32\n"
    "    %z = arith.mulf %t, %c : f32\n"
    "    attn.yield %z : f32\n"
    "  }"
)
CASES = {
    **FAMILIES,
    "score_mod": (dict(score_ops=[SCORE_MOD, CAUSAL]), None),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu_grad_kernels")


def check_gradients(ir: str, args: list[torch.Tensor], folder: Path, nq: int, **options) -> tuple[str, str]:
    """Forward and backward kernels (compiled with the pipeline's `options`) on CUDA copies of
    `args`; the output and every gradient against the reference on `args` (float64,
    autograd). Returns both kernels' sources."""
    dtype = args[0].dtype
    module = parse_module(ir)
    func = next(iter(module.ops))
    wrt = tuple(sorted(differentiable_args(analyse(func))))  # type: ignore[arg-type]
    sm = device_sm()
    sources = (
        compile_module(module, sm=sm, seq_len=args[1].shape[2], **options).source,
        compile_module(module, sm=sm, seq_len=args[1].shape[2], direction="bwd", wrt=wrt, **options).source,
    )
    fwd, bwd = (load_source(s, folder, interpret=False) for s in sources)
    cuda = [a.cuda() for a in args]
    out, lse = fwd.launch(*cuda)
    dout = randn(*out.shape, dtype=dtype, seed=99).cuda()
    grads = bwd.launch(*cuda, out, lse, dout)
    torch.cuda.synchronize()
    xs = [a.double().requires_grad_() if a.is_floating_point() else a for a in args]
    ref = run_reference(ir, *xs, compute_dtype=torch.float64)
    out_err = ((out.detach().cpu().double() - ref.detach()).norm() / ref.detach().norm()).item()
    assert out_err < GRAD_TOL[dtype], f"output: relative L2 error {out_err:.2e}"
    refs = torch.autograd.grad(ref, [xs[i] for i in wrt], dout.cpu().double())
    for i, g, r in zip(wrt, grads, refs, strict=True):
        assert g.shape == args[i].shape and g.dtype == args[i].dtype, f"gradient {i}: {g.shape} {g.dtype}"
        g = g.detach().cpu().double()
        assert torch.isfinite(g).all(), f"gradient of argument {i}: non-finite values"
        err = ((g - r).norm() / r.norm()).item()
        assert err < GRAD_TOL[dtype], f"gradient of argument {i}: relative L2 error {err:.2e}"
    return sources


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("family", list(CASES))
def test_family_gradients(family: str, dtype_name: str, folder: Path) -> None:
    dtype = DTYPES[dtype_name]
    pieces, make_extras = CASES[family]
    n = 300
    ir = build_ir(dtype_name, **pieces)
    q, k, v = (randn(*s, dtype=dtype, seed=i) for i, s in enumerate([(B, HQ, n, D), (B, HKV, n, D), (B, HKV, n, D)]))
    extras = make_extras(dtype, n) if make_extras else []
    check_gradients(ir, [q, k, v, *extras], folder, n)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("approx", [True, False], ids=["approx", "exact"])
@pytest.mark.parametrize("family", ["softcap", "score_mod"])
def test_tanh_both_ways(family: str, approx: bool, dtype_name: str, folder: Path) -> None:
    """A softcap and a score_mod's tanh on scores large enough to bend (q and k scaled by 2),
    forward and backward, by the approximate instruction in every kernel (kernel-path's
    `tanh="approx"`) and by the exact form (`tanh="exact"`): both within the tolerances."""
    dtype = DTYPES[dtype_name]
    pieces, _ = CASES[family]
    n = 300
    ir = build_ir(dtype_name, **pieces)
    q, k, v = (randn(*s, dtype=dtype, seed=i) for i, s in enumerate([(B, HQ, n, D), (B, HKV, n, D), (B, HKV, n, D)]))
    q, k = (x * 2 for x in (q, k))
    sources = check_gradients(ir, [q, k, v], folder, n, tanh="approx" if approx else "exact")
    assert all(("_fast_tanh(" in s) is approx for s in sources)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("nq", [1, 77])
def test_fewer_queries_than_keys_gradients(nq: int, dtype_name: str, folder: Path) -> None:
    dtype = DTYPES[dtype_name]
    ir = build_ir(dtype_name, q_ops=[ROPE], k_ops=[ROPE], score_ops=[CAUSAL])
    q = randn(B, HQ, nq, D, dtype=dtype, seed=1)
    k, v = randn(B, HKV, 300, D, dtype=dtype, seed=2), randn(B, HKV, 300, D, dtype=dtype, seed=3)
    check_gradients(ir, [q, k, v], folder, nq)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_llama_shape_gradients(dtype_name: str, folder: Path) -> None:
    """The Llama-3-8B head layout (32 query, 8 kv heads of dim 128) at N = 1000: the sm90
    tile table's backward entry for head dim 128."""
    dtype = DTYPES[dtype_name]
    rope = "attn.rope {x} half theta = 500000.0 rotary_dim = 128"
    from kernel_harness import variant

    ir = variant(dtype=dtype, hq=32, hkv=8, d=128, q_ops=[rope], k_ops=[rope], score_ops=[CAUSAL])
    q = randn(1, 32, 1000, 128, dtype=dtype, seed=11)
    k, v = randn(1, 8, 1000, 128, dtype=dtype, seed=12), randn(1, 8, 1000, 128, dtype=dtype, seed=13)
    check_gradients(ir, [q, k, v], folder, 1000)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_explicit_positions_gradients(dtype_name: str, folder: Path) -> None:
    """RoPE at explicit positions (a left-padded batch for q, [B, N]; a shard of a longer
    sequence for k, [N]): output through the forward kernel, gradients through the backward."""
    e = dtype_name
    qt, kt = f"tensor<?x{HQ}x?x{D}x{e}>", f"tensor<?x{HKV}x?x{D}x{e}>"
    ir = f"""func.func @f(%q: {qt}, %k: {kt}, %v: {kt}, %qp: tensor<?x?xi64>, %kp: tensor<?xi32>) -> {qt} {{
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = {D} positions(%qp : tensor<?x?xi64>) : {qt}
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = {D} positions(%kp : tensor<?xi32>) : {kt}
  %s = attn.qk %qr, %kr : {qt}, {kt} -> !attn.scores<{HQ}>
  %m = attn.mask %s causal : !attn.scores<{HQ}>
  %p = attn.softmax %m : !attn.scores<{HQ}> -> !attn.probs<{HQ}>
  %o = attn.pv %p, %v : !attn.probs<{HQ}>, {kt} -> {qt}
  func.return %o : {qt}
}}"""
    dtype, n = DTYPES[dtype_name], 300
    q, k, v = (
        randn(*s, dtype=dtype, seed=20 + i) for i, s in enumerate([(B, HQ, n, D), (B, HKV, n, D), (B, HKV, n, D)])
    )
    qp = torch.stack([torch.arange(n) - 17, torch.arange(n) + 4000])
    kp = (torch.arange(n) + 1000).to(torch.int32)
    check_gradients(ir, [q, k, v, qp, kp], folder, n)
