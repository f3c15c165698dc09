"""The named variants of `attnfuse.variants`: their IR, the reference backend against the
reference executor and against plain float64 formulas of the published models, the
generated kernels under the Triton interpreter, and (marked gpu) on a CUDA GPU."""

from __future__ import annotations

import math

import plain_attention as plain
import pytest
import torch

import attnfuse as af
from attnfuse import variants
from attnfuse.reference import run_reference

F64 = torch.float64
B, HQ, HKV, NQ, NK, D = 2, 4, 2, 24, 40, 32


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def inputs(name: str, dtype=torch.float32, device="cpu", nq=NQ, nk=NK):
    """q, k, v and the variant's extra tensors."""
    q, k, v = rand(B, HQ, nq, D, seed=1), rand(B, HKV, nk, D, seed=2), rand(B, HKV, nk, D, seed=3)
    extras: tuple = ()
    if name == "qwen3":
        extras = (rand(D, seed=4).abs() + 0.5, rand(D, seed=5).abs() + 0.5)
    elif name == "bloom":
        extras = (af.alibi_slopes(HQ),)
    elif name == "gpt_oss":
        extras = (rand(HQ, seed=6),)
    elif name == "packed_documents":
        extras = (torch.tensor([[0] * 7 + [1] * 20 + [2] * (nk - 27), [5] * 30 + [6] * (nk - 30)], dtype=torch.int32),)
    tensors = [x.to(dtype) if x.is_floating_point() and x.dim() == 4 else x for x in (q, k, v, *extras)]
    return tuple(x.to(device) for x in tensors)


def expected(name: str, q, k, v, *extras) -> torch.Tensor:
    """The published model's attention, written out in float64."""
    nq, nk = q.shape[2], k.shape[2]
    qp, kp = plain.positions(nq, nk)
    d = qp[:, None] - kp[None, :]
    causal = d >= 0
    if name == "llama3":
        inv = plain.llama3_inv_freq(500000.0, D, 8.0, 1.0, 4.0, 8192.0)
        return plain.finish(plain.scores(plain.rope(q, qp, inv), plain.rope(k, kp, inv)), v, causal)
    if name == "mistral":
        inv = plain.default_inv_freq(10000.0, D)
        s = plain.scores(plain.rope(q, qp, inv), plain.rope(k, kp, inv))
        return plain.finish(s, v, causal & (d < 4096))
    if name == "gemma2":
        inv = plain.default_inv_freq(10000.0, D)
        s = plain.scores(plain.rope(q, qp, inv), plain.rope(k, kp, inv), scale=256**-0.5)
        return plain.finish(50.0 * torch.tanh(s / 50.0), v, causal & (d < 4096))
    if name == "qwen3":
        inv = plain.default_inv_freq(1e6, D)
        qn, kn = plain.rms_norm(q, extras[0]), plain.rms_norm(k, extras[1])
        return plain.finish(plain.scores(plain.rope(qn, qp, inv), plain.rope(kn, kp, inv)), v, causal)
    if name == "bloom":
        bias = extras[0].to(F64)[None, :, None, None] * (kp[None, :] - qp[:, None])
        return plain.finish(plain.scores(q, k) + bias, v, causal)
    if name == "gpt_oss":
        inv, mag = plain.yarn_inv_freq(150000.0, D, 32.0, 4096.0, 32.0, 1.0, truncate=False)
        s = plain.scores(plain.rope(q, qp, inv, magnitude=mag), plain.rope(k, kp, inv, magnitude=mag))
        return plain.finish(s, v, causal & (d < 128), sink=extras[0])
    assert name == "packed_documents"
    ids = extras[0].long()
    same = ids[:, None, qp, None] == ids[:, None, None, kp]
    return plain.finish(plain.scores(q, k), v, causal & same)


NAMES = ["llama3", "mistral", "gemma2", "qwen3", "bloom", "gpt_oss", "packed_documents"]

IR_FRAGMENTS = {
    "llama3": [
        "theta = 500000.0",
        "#attn.rope_scaling<llama3, factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, "
        "original_max_position = 8192.0>",
        "causal",
    ],
    "mistral": ["theta = 10000.0", "sliding_window(4096)"],
    "gemma2": ["scale = 0.0625", "attn.softcap", "cap = 50.0", "sliding_window(4096)"],
    "qwen3": ["attn.norm %q eps = 1.0e-06 weight(%q_norm_weight", "theta = 1000000.0", "causal"],
    "bloom": ["alibi(%slopes : tensor<4xf32>)", "causal"],
    "gpt_oss": [
        "#attn.rope_scaling<yarn, factor = 32.0, original_max_position = 4096.0, beta_fast = 32.0, beta_slow = 1.0, "
        "truncate = false>",
        "theta = 150000.0",
        "sliding_window(128)",
        "sink(%sinks : tensor<4xf32>)",
    ],
    "packed_documents": ["causal", "document(%doc_ids : tensor<?x?xi32>)"],
}


@pytest.mark.parametrize("name", NAMES)
def test_named_variant_reference_and_formula(name):
    variant = getattr(variants, name)
    args = inputs(name)
    with af.backend("reference"):
        out = variant(*args)
    oracle = run_reference(variant.ir_module(*args), *args)
    torch.testing.assert_close(oracle, expected(name, *args), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(out.to(F64), oracle, atol=2e-5, rtol=1e-4)
    text = variant.ir(*args)
    for fragment in IR_FRAGMENTS[name]:
        assert fragment in text


def test_named_variants_differ_where_their_models_do():
    """Windows and scaling matter beyond the test lengths used above."""
    args = inputs("mistral", nq=8, nk=5000)
    causal_only = af.variant(lambda q, k, v: af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v))
    rope_causal = af.variant(
        lambda q, k, v: af.pv(
            af.softmax(af.mask(af.qk(af.rope(q, theta=10000.0), af.rope(k, theta=10000.0)), af.causal)), v
        )
    )
    with af.backend("reference"):
        windowed = variants.mistral(*args)
        assert not torch.allclose(windowed, rope_causal(*args), atol=1e-4)
        assert not torch.allclose(windowed, causal_only(*args), atol=1e-4)
    torch.testing.assert_close(windowed.to(F64), expected("mistral", *args), atol=2e-5, rtol=1e-4)


def test_alibi_slopes():
    assert af.alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    assert af.alibi_slopes(1).tolist() == [2.0**-8]
    torch.testing.assert_close(af.alibi_slopes(4), torch.tensor([0.25, 0.0625, 0.015625, 0.00390625]))
    # 12 heads: the 8-head slopes, then the odd powers of 2^(-1/2) (the 16-head ratio)
    expected = [2.0**-i for i in range(1, 9)] + [2.0 ** (-0.5 * p) for p in (1, 3, 5, 7)]
    torch.testing.assert_close(af.alibi_slopes(12), torch.tensor(expected, dtype=torch.float32))
    assert af.alibi_slopes(6).dtype == torch.float32 and af.alibi_slopes(6).shape == (6,)
    with pytest.raises(af.AttnFuseError, match=r"alibi_slopes\(n_heads\) needs an integer n_heads >= 1, got 0"):
        af.alibi_slopes(0)


@pytest.mark.parametrize("name", NAMES)
def test_named_variant_interpreted(name, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path))
    variant = getattr(variants, name)
    args = inputs(name, dtype=torch.float16)
    with af.backend("interpret"):
        out = variant(*args)
    oracle = run_reference(variant.ir_module(*args), *args)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.to(F64), oracle, atol=4e-3, rtol=4e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", NAMES)
def test_named_variant_on_gpu(name, dtype):
    variant = getattr(variants, name)
    args = inputs(name, dtype=dtype, device="cuda", nq=300, nk=1000)
    out = variant(*args)  # auto: Triton on CUDA tensors
    oracle = run_reference(variant.ir_module(*args), *args)
    err = (out.to(F64) - oracle).abs().max().item()
    # bf16 keeps 8 mantissa bits: with QK-norm'd scores up to ~13 (qwen3 here), rounding q and k
    # to bf16 alone moves the output by 2.2e-2 (measured in float64 on the CPU).
    tol = 5e-2 if dtype == torch.bfloat16 else 4e-3
    print(f"{name} {dtype}: max abs error {err:.2e}")
    assert out.dtype == dtype and err < tol and math.isfinite(err)
