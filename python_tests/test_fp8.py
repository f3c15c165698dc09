"""The FP8 form's blocks (issue 24, first part): `af.hadamard` and `af.quantize_fp8`, their ops'
semantics in the reference executor against independent formulas, and their errors: a Hadamard
on q without the same on k, a head dim that is not a power of two, transforms after the
quantization, a backward (the kernels: test_fp8_kernel.py)."""

from __future__ import annotations

import math

import pytest
import torch

import attnfuse as af
from attnfuse.low_precision import quantize_e4m3, random_signs

D = 64


def _qkv(n=70, hq=4, hkv=2, d=D, seed=0, outliers=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, n, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv))
    if outliers:  # a few channels 30x larger, as activations with outlier features have
        q[..., 3] *= 30
        k[..., 5] *= 30
    return q, k, v


def _plain(q, k, v, causal=True):
    """Softmax attention in float64, GQA by repetition: an independent formula."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq).logical_not(), -math.inf)
    return s.softmax(-1) @ v


def _quantized(x, block):
    """e4m3 with per-block (rows of one batch and head) or per-tensor scales, written out."""
    out = torch.empty_like(x)
    groups = [(slice(None), slice(None), slice(0, x.shape[2]))] if block is None else [
        (b, h, slice(r, r + block)) for b in range(x.shape[0]) for h in range(x.shape[1])
        for r in range(0, x.shape[2], block)
    ]  # fmt: skip
    for g in groups:
        scale = x[g].abs().max() / 448.0
        out[g] = (x[g] / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale
    return out


def _variant(hadamard: int | None, block: int | None, quantize: bool = True, v8: bool = True) -> af.Variant:
    def fp8(q, k, v):
        if hadamard is not None:
            q, k = af.hadamard(q, seed=hadamard), af.hadamard(k, seed=hadamard)
        if quantize:
            q, k = af.quantize_fp8(q, block=block), af.quantize_fp8(k, block=block)
        if v8:
            v = af.quantize_fp8(v, block=block)
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    return af.Variant(fp8)


# ----------------------------------------------------------------------------- the Hadamard rotation


@pytest.mark.parametrize("d", [1, 2, 16, 64, 128, 256])
def test_hadamard_matrix_is_orthogonal(d):
    m = af.hadamard_matrix(d, seed=5)
    torch.testing.assert_close(m @ m.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.all(m.abs() == 1 / math.sqrt(d))
    # diag(signs) times Sylvester's Hadamard: row i is H's row i times sign i.
    signs = random_signs(d, 5)
    h = m * math.sqrt(d) * signs[:, None]
    assert torch.all(h[0] == 1) and torch.all(h[:, 0] == 1)
    if d >= 2:
        torch.testing.assert_close(h[: d // 2, d // 2 :], h[: d // 2, : d // 2])
        torch.testing.assert_close(h[d // 2 :, d // 2 :], -h[: d // 2, : d // 2])


def test_hadamard_seeds():
    assert torch.equal(af.hadamard_matrix(64, seed=3), af.hadamard_matrix(64, seed=3))
    assert not torch.equal(af.hadamard_matrix(64, seed=3), af.hadamard_matrix(64, seed=4))
    for bad in (0, 96, -4):
        with pytest.raises(af.AttnFuseError, match="power of two"):
            af.hadamard_matrix(bad)


def test_hadamard_leaves_the_scores_unchanged():
    """The same rotation on q and k: the output of the plain variant (no quantization), and the
    rotated q is x @ M."""
    q, k, v = _qkv()
    with af.backend("reference"):
        got = _variant(hadamard=11, block=None, quantize=False, v8=False)(q, k, v)
    torch.testing.assert_close(got, _plain(q, k, v), rtol=0, atol=1e-12)

    @af.variant
    def rotated_scores(q, k, v):  # unscaled, unmasked: (q M)(k M)^T computed from M itself
        return af.pv(af.softmax(af.qk(af.hadamard(q, seed=11), af.hadamard(k, seed=11), scale=1.0)), v)

    m = af.hadamard_matrix(D, seed=11)
    with af.backend("reference"):
        got = rotated_scores(q, k, v)
    s = (q @ m) @ (k @ m).repeat_interleave(2, 1).transpose(-1, -2)
    want = s.softmax(-1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- quantization


@pytest.mark.parametrize("block", [None, 1, 16, 64, 100])
def test_quantize_matches_the_formula(block):
    """Every value an e4m3 number times its block's scale, each block's largest magnitude kept
    (it maps to 448), N not a multiple of the block included."""
    x = _qkv(n=70)[0]
    got = quantize_e4m3(x, block or 0)
    torch.testing.assert_close(got, _quantized(x, block), rtol=0, atol=0)
    rows = [x] if block is None else [x[:, :, r : r + block] for r in range(0, 70, block)]
    outs = [got] if block is None else [got[:, :, r : r + block] for r in range(0, 70, block)]
    for xb, yb in zip(rows, outs, strict=True):
        dims = (0, 1, 2, 3) if block is None else (2, 3)  # largest magnitude: 448 x scale, to rounding
        torch.testing.assert_close(yb.abs().amax(dims), xb.abs().amax(dims), rtol=1e-15, atol=0)
    # e4m3 keeps 3 mantissa bits: relative error of a normal number at most 2^-4.
    normal = x.abs() > x.abs().max() / 448 * 2**-6
    assert ((got - x).abs() <= x.abs() * 2**-4 + 1e-300)[normal].all()


def test_quantize_zero_block_and_round_trip():
    x = torch.zeros(1, 1, 8, D, dtype=torch.float64)
    x[..., 4:, :] = torch.linspace(-3, 3, 4 * D, dtype=torch.float64).view(4, D)
    got = quantize_e4m3(x, 4)
    assert torch.all(got[..., :4, :] == 0)
    again = quantize_e4m3(got, 4)  # quantized values are fixed points
    torch.testing.assert_close(again, got, rtol=0, atol=0)


@pytest.mark.parametrize(("hadamard", "block"), [(None, None), (None, 32), (7, 32), (7, None)])
def test_variant_against_independent_formula(hadamard, block):
    q, k, v = _qkv(outliers=True)
    if hadamard is not None:
        m = af.hadamard_matrix(D, seed=hadamard)
        qt, kt = q @ m, k @ m
    else:
        qt, kt = q, k
    want = _plain(_quantized(qt, block), _quantized(kt, block), _quantized(v, block))
    with af.backend("reference"):
        got = _variant(hadamard, block)(q, k, v)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_blocks_and_rotation_against_an_extreme_outlier():
    """Where e4m3's range, not its 3-bit mantissa, limits (float64 arithmetic otherwise): small
    values with one entry 1e5 times larger. One scale per tensor flushes the small values toward
    zero; a scale per block of 16 rows confines that to the outlier's block, and the rotation
    spreads the outlier over the head dim (its largest magnitude / 8 at D 64)."""
    q, k, v = (t * 1e-2 for t in _qkv(n=64, seed=4))
    q[0, 1, 40, 7] = k[1, 0, 3, 9] = 1e3
    exact = _plain(q, k, v)
    errors = {}
    with af.backend("reference"):
        for name, (h, block) in {"tensor": (None, None), "block": (None, 16), "tensor+hadamard": (5, None)}.items():
            out = _variant(h, block, v8=False)(q, k, v)
            errors[name] = ((out - exact).norm() / exact.norm()).item()
    assert errors["block"] < errors["tensor"] / 2
    assert errors["tensor+hadamard"] < errors["tensor"] / 2


def test_cache_keys_rotate_and_refuse_quantization():
    """K's chain as a cache holds it: RoPE, then the rotation (position-wise, so keys may be
    written a few at a time). A quantized K or q is refused by cache_keys and decode: their
    scales span blocks of a whole sequence, which keys written in pieces, or the last queries
    alone, do not cover."""

    def make(quantize: bool) -> af.Variant:
        def fp8_rope(q, k, v):
            q = af.hadamard(af.rope(q, theta=10000.0), seed=2)
            k = af.hadamard(af.rope(k, theta=10000.0), seed=2)
            if quantize:
                q, k = af.quantize_fp8(q, block=16), af.quantize_fp8(k, block=16)
            return af.pv(af.softmax(af.qk(q, k)), v)

        return af.Variant(fp8_rope)

    @af.variant
    def rope_only(q, k, v):
        return af.pv(af.softmax(af.qk(af.rope(q, theta=10000.0), af.rope(k, theta=10000.0))), v)

    q, k, v = (t.float() for t in _qkv())
    rotated = rope_only.cache_keys(k, torch.arange(70)).double() @ af.hadamard_matrix(D, seed=2)
    torch.testing.assert_close(make(False).cache_keys(k, torch.arange(70)).double(), rotated, rtol=1e-6, atol=1e-6)
    quantized = make(True)
    with pytest.raises(af.AttnFuseError, match="cache_keys: the variant quantizes with af.quantize_fp8"):
        quantized.cache_keys(k, torch.arange(70))
    lens = torch.tensor([70, 12], dtype=torch.int32)
    with af.backend("reference"), torch.no_grad(), pytest.raises(af.AttnFuseError, match="decode of the FP8 form"):
        quantized.decode(q[:, :, -1:], k, v, lens)


def test_ir_shows_the_ops():
    q, k, v = _qkv(n=8)
    text = _variant(3, 64).ir(q.float(), k.float(), v.float())
    assert "attn.hadamard %q seed = 3" in text and "attn.quantize %q_had e4m3 block = 64" in text
    assert "attn.quantize %v e4m3 block = 64" in text


# ----------------------------------------------------------------------------- errors


def test_blocks_refuse_what_does_not_compose():
    q, k, v = (t.float() for t in _qkv(n=8))

    def run(fn):
        with af.backend("reference"):
            return af.Variant(fn)(q, k, v)

    with pytest.raises(af.AttnFuseError, match=r"same attn.hadamard rotations .* seeds \[1\] on q and \[\] on k"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.hadamard(q, seed=1), k)), v))
    with pytest.raises(af.AttnFuseError, match=r"seeds \[1\] on q and \[2\] on k"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.hadamard(q, seed=1), af.hadamard(k, seed=2))), v))
    with pytest.raises(af.AttnFuseError, match="q was already quantized by af.quantize_fp8"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.rope(af.quantize_fp8(q)), k)), v))
    with pytest.raises(af.AttnFuseError, match="af.quantize_fp8 block must be a positive number of rows or None"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.quantize_fp8(q, block=0), k)), v))
    with pytest.raises(af.AttnFuseError, match="af.hadamard seed must be an integer"):
        run(lambda q, k, v: af.pv(af.softmax(af.qk(af.hadamard(q, seed=1.5), af.hadamard(k, seed=1.5))), v))
    q96, k96 = torch.randn(1, 2, 8, 96), torch.randn(1, 2, 8, 96)
    with af.backend("reference"), pytest.raises(af.AttnFuseError, match="power of two, got 96"):
        _variant(1, None)(q96, k96, k96)


def test_forward_only():
    q, k, v = (t.float() for t in _qkv(n=8))
    with af.backend("reference"), pytest.raises(af.AttnFuseError, match="forward-only .* requires grad"):
        _variant(1, 8)(q.requires_grad_(), k, v)
