"""The FP8 form's kernels (kernel path `fp8`, `passes/fp8_to_tl.py`) under the Triton interpreter:
the quantization kernels against the reference executor's e4m3 values (with V unquantized the
outputs agree to fp32 rounding), P's e4m3 rounding against a formula written out for one block of
keys, and the errors of what the path does not take. The interpreter multiplies the e4m3 values
in fp32 (`mma = "f32"`); the e4m3 products run in test_gpu_fp8.py."""

from __future__ import annotations

import math

import pytest
import torch

import attnfuse as af
from attnfuse.low_precision import hadamard_matrix, quantize_e4m3


def _inputs(b=1, hq=4, hkv=2, nq=70, nk=70, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g).to(dtype)
    k, v = (torch.randn(b, hkv, nk, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def _variant(block_q, block_k, block_v="none", hadamard=None, rope=False, causal=True, softcap=None):
    def fp8(q, k, v):
        if rope:
            q, k = af.rope(q), af.rope(k)
        if hadamard is not None:
            q, k = af.hadamard(q, seed=hadamard), af.hadamard(k, seed=hadamard)
        q, k = af.quantize_fp8(q, block=block_q), af.quantize_fp8(k, block=block_k)
        if block_v != "none":
            v = af.quantize_fp8(v, block=block_v)
        s = af.qk(q, k)
        if softcap is not None:
            s = af.softcap(s, softcap)
        if causal:
            s = af.mask(s, af.causal)
        return af.pv(af.softmax(s), v)

    return af.Variant(fp8)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _both(var, *args):
    with af.backend("reference"):
        ref = var(*args)
    with af.backend("interpret"):
        out = var(*args)
    return out, ref


# With V unquantized, the kernel's only differences from the reference are fp32 arithmetic: the
# quantization kernels must reproduce every e4m3 value and scale (one wrong e4m3 step moves a
# score by 6%).
@pytest.mark.parametrize(
    ("block_q", "block_k", "hadamard", "rope"),
    [
        (None, None, None, False),  # per tensor: maxima kernels, the largest on the host
        (32, 32, None, False),  # one scale per BLOCK_M/BLOCK_N tile: scalar scales
        (16, 64, 3, True),  # blocks smaller and larger than the tiles: gathered scales
        (100, 24, 3, True),  # not powers of two; 100 rows transformed in two tiles
    ],
)
def test_quantized_q_and_k_match_the_reference(block_q, block_k, hadamard, rope):
    q, k, v = _inputs(nq=50, nk=130)  # fewer queries than keys, GQA, lengths off the tiles
    out, ref = _both(_variant(block_q, block_k, hadamard=hadamard, rope=rope), q, k, v)
    assert _rel(out, ref) < 1e-5


def test_quantization_rounds_up_to_powers_of_two():
    # Values just below a power of two times the scale round up to it: 31.8 -> 32 (the
    # interpreter's own e4m3 cast gives 16 there; the kernel's rounding must not).
    q = torch.full((1, 1, 32, 32), 31.8)
    q[0, 0, 0, 0] = 448.0  # the block's largest: scale 1
    k = torch.eye(32)[None, None] * 448.0
    v = torch.eye(32)[None, None]
    var = _variant(32, 32, causal=False)
    out, ref = _both(var, q / 448.0**0.5, k / 448.0**0.5, v)
    assert _rel(out, ref) < 1e-5


def _p_rounded(q, k, v, block):
    """Softmax attention of e4m3 q, k (per-tensor scales) and v (per `block` rows), with P rounded
    to e4m3 as the kernel does it within one block of keys: exp(s - row max) times each key's V
    scale over the block's largest times 2^8, rounded, the product times largest / 2^8."""
    q8, k8 = quantize_e4m3(q.double(), 0), quantize_e4m3(k.double(), 0)
    v8 = quantize_e4m3(v.double(), block)
    amax = v.double().reshape(v.shape[0], v.shape[1], -1, block, v.shape[3]).abs().amax((3, 4))
    sv = (amax / 448.0).repeat_interleave(block, 2)  # [B, H, N]
    s = q8 @ k8.transpose(-1, -2) / math.sqrt(q.shape[-1])
    p = (s - s.amax(-1, keepdim=True)).exp()
    largest = sv.amax(-1, keepdim=True)
    w = (sv / largest * 256.0)[:, :, None, :]
    p8 = (p * w).to(torch.float32).to(torch.float8_e4m3fn).double()
    return (p8 @ (v8 / sv[..., None])) * (largest[..., None] / 256.0) / p.sum(-1, keepdim=True)


@pytest.mark.parametrize("block", [8, 32])
def test_p_rounded_to_e4m3_as_written_out(block):
    # One block of keys (N <= BLOCK_N = 32 on the interpreter): no running maximum, so the
    # rounding of P can be written out exactly.
    q, k, v = _inputs(hq=1, hkv=1, nq=32, nk=32, seed=4)
    with af.backend("interpret"):
        out = _variant(None, None, block, causal=False)(q, k, v)
    assert _rel(out, _p_rounded(q, k, v, block)) < 1e-5


@pytest.mark.parametrize("block_v", [None, 16])
def test_quantized_v_is_within_ps_rounding(block_v):
    q, k, v = _inputs(nq=90, nk=90, dtype=torch.float16, seed=1)
    out, ref = _both(_variant(32, 32, block_v, hadamard=0, softcap=30.0), q, k, v)
    assert out.dtype == torch.float16
    assert _rel(out, ref) < 0.03  # P in e4m3: about 2^-4 per probability, averaged


def test_hadamard_without_quantization_runs_in_the_generic_kernel():
    @af.variant
    def rotated(q, k, v):
        q, k = af.hadamard(af.rope(q), seed=2), af.hadamard(af.rope(k), seed=2)
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    @af.variant
    def plain(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(af.rope(q), af.rope(k)), af.causal)), v)

    q, k, v = _inputs(nq=40, nk=40)
    with af.backend("interpret"):
        assert _rel(rotated(q, k, v), plain(q, k, v)) < 1e-5
        assert "hadamard_table" in rotated.compile(q, k, v).source


def test_the_kernels_read_what_the_ir_says():
    q, k, v = _inputs(nq=40, nk=40)
    var = _variant(16, None, None, hadamard=5)
    with af.backend("interpret"):
        src = var.compile(q, k, v).source
    for name in (
        "def quantize_q(",
        "def amax_k(",
        "def quantize_k(",
        "def amax_v(",
        "def quantize_v(",
        "def attn_fwd(",
    ):
        assert name in src
    assert "_hadamard_table(32, 5," in src
    assert "v8 = v8.transpose(2, 3)" in src  # V's e4m3 copy is channel-major
    m = hadamard_matrix(32, 5)
    from attnfuse.targets.triton import prelude

    h, signs = prelude._hadamard_table(32, 5, torch.device("cpu"))
    assert torch.allclose(signs.double()[:, None] * h.double() / math.sqrt(32), m, rtol=0, atol=1e-15)


def test_what_the_fp8_path_refuses():
    q, k, v = _inputs(nq=16, nk=16)

    @af.variant
    def q_only(q, k, v):
        return af.pv(af.softmax(af.qk(af.quantize_fp8(q), k)), v)

    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match="but k is not quantized"):
        q_only(q, k, v)
    var = _variant(8, 8)
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match="forward-only .* requires grad"):
        var(q.clone().requires_grad_(), k, v)
    with torch.no_grad(), af.backend("interpret"):
        var(q.clone().requires_grad_(), k, v)  # no grad mode: a forward
    q12, k12 = torch.randn(1, 2, 16, 12), torch.randn(1, 2, 16, 12)
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match="powers of two from 16, got \\[12\\]"):
        _variant(8, 8)(q12, k12, k12)


def test_hadamard_in_the_decode_kernel():
    # Q's rotation in the decode kernel's prologue, K's in cache_keys: as the whole forward.
    @af.variant
    def rotated(q, k, v):
        q, k = af.hadamard(af.rope(q), seed=2), af.hadamard(af.rope(k), seed=2)
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    g = torch.Generator().manual_seed(5)
    k, v = (torch.randn(2, 2, 64, 32, generator=g) for _ in range(2))
    q = torch.randn(2, 4, 1, 32, generator=g)
    lengths = torch.tensor([40, 64], dtype=torch.int32)
    with af.backend("interpret"):
        out = rotated.decode(q, rotated.cache_keys(k, torch.arange(64)), v, lengths)
    with af.backend("reference"):
        ref = torch.cat(
            [rotated(q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n]) for b, n in enumerate([40, 64])]
        )
    assert _rel(out, ref) < 1e-5


@pytest.mark.parametrize(("nq", "nk"), [(0, 16), (16, 0)])
def test_empty_queries_or_keys(nq, nk):
    # Per-tensor scales of an empty tensor: no maxima to take (scale 1), no crash.
    q, k, v = _inputs(hq=2, hkv=2, nq=nq, nk=nk, d=16)
    var = _variant(None, None, None)
    out, ref = _both(var, q, k, v)
    assert out.shape == (1, 2, nq, 16)
    assert torch.equal(out, ref.to(out.dtype))


def test_head_dim_256():
    # Without a rotation the FP8 kernels take D 256 (64-row quantization tiles); a Hadamard rotation
    # there is refused by name (its matrix would not fit an SM's shared memory).
    q, k, v = _inputs(hq=2, hkv=1, nq=20, nk=20, d=256)
    out, ref = _both(_variant(None, 16, None), q, k, v)
    assert _rel(out, ref) < 0.03
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match="attn.hadamard at head dim 256 has no kernel"):
        _variant(None, 16, hadamard=1)(q, k, v)
