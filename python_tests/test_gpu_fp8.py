"""The FP8 form on the GPU (kernel path `fp8` with e4m3 products on sm 89 and up): the triton
backend against the reference executor, bf16 and fp16, GQA, fewer queries than keys, lengths off
the tiles, per-tensor and per-block scales, RoPE and Hadamard rotations fused in the quantization
kernels; the sm90 Gluon kernel on e4m3 tiles (sinks, no mask, head dims 64 and 128, transformers'
layout written in place); a CUDA-graph replay; the e4m3 products visible in the generated source."""

from __future__ import annotations

import pytest
import torch

import attnfuse as af

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _variant(block_q, block_k, block_v="none", hadamard=None, rope=False, window=None):
    def fp8(q, k, v):
        if rope:
            q, k = af.rope(q, theta=500000.0), af.rope(k, theta=500000.0)
        if hadamard is not None:
            q, k = af.hadamard(q, seed=hadamard), af.hadamard(k, seed=hadamard)
        q, k = af.quantize_fp8(q, block=block_q), af.quantize_fp8(k, block=block_k)
        if block_v != "none":
            v = af.quantize_fp8(v, block=block_v)
        s = af.mask(af.qk(q, k), af.causal if window is None else af.sliding_window(window))
        return af.pv(af.softmax(s), v)

    return af.Variant(fp8)


def _inputs(hq, hkv, nq, nk, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, hq, nq, d, generator=g, device="cuda", dtype=dtype)
    k, v = (torch.randn(2, hkv, nk, d, generator=g, device="cuda", dtype=dtype) for _ in range(2))
    return q, k, v


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


CASES = [
    # (block_q, block_k, block_v, hadamard, rope, window)
    (None, None, "none", None, False, None),
    (128, 128, "none", 7, True, None),
    (64, 256, "none", 7, True, 300),
    (None, None, None, None, False, None),
    (128, 128, 128, 7, True, None),
    (100, 48, 32, 7, True, None),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("hq", "hkv", "nq", "nk", "d"), [(32, 8, 1000, 1000, 128), (8, 2, 77, 1300, 64)])
def test_fp8_matches_the_reference(case, dtype, hq, hkv, nq, nk, d):
    block_q, block_k, block_v, hadamard, rope, window = CASES[case]
    var = _variant(block_q, block_k, block_v, hadamard, rope, window)
    q, k, v = _inputs(hq, hkv, nq, nk, d, dtype, seed=case)
    with torch.no_grad():
        with af.backend("triton"):
            out = var(q, k, v)
        with af.backend("reference"):
            ref = var(q, k, v)
    assert out.dtype == dtype and out.shape == q.shape
    # Output rounding alone with V unquantized (the e4m3 values are the reference's); P's e4m3
    # rounding with it.
    assert _rel(out, ref) < (0.005 if block_v == "none" else 0.03)


def test_e4m3_products_and_cuda_graphs():
    var = _variant(128, 128, 128, 3, True)
    q, k, v = _inputs(32, 8, 2048, 2048, 128, torch.bfloat16)
    with af.backend("triton"):
        src = var.compile(q, k, v).source
        assert "tl.dot(q8_1, k" in src  # e4m3 operands, no upcast
        eager = var(q, k, v)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            var(q, k, v)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            captured = var(q, k, v)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


@pytest.mark.parametrize(
    ("block", "causal", "sink", "d"),
    [(128, True, False, 128), (None, True, True, 128), (256, False, False, 128), (128, True, False, 64)],
)
def test_gluon_fp8_matches_the_reference(block, causal, sink, d):
    # N a multiple of 128 from min_len: the sm90 Gluon kernel on the e4m3 tiles.
    def fp8(q, k, v, s):
        q, k = (af.quantize_fp8(af.hadamard(af.rope(x, theta=500000.0), seed=2), block=block) for x in (q, k))
        scores = af.qk(q, k)
        if causal:
            scores = af.mask(scores, af.causal)
        return af.pv(af.softmax(scores, sink=s if sink else None), af.quantize_fp8(v, block=block))

    var = af.Variant(fp8)
    q, k, v = _inputs(16, 4, 2048, 2048, d, torch.bfloat16, seed=d)
    s = torch.randn(16, device="cuda")
    with torch.no_grad():
        with af.backend("triton"):
            out = var(q, k, v, s)
            src = var.compile(q, k, v, s).source
        with af.backend("reference"):
            ref = var(q, k, v, s)
    assert "_gluon_attention(q8, k8, v8" in src
    assert _rel(out, ref) < 0.03


def test_gluon_fp8_in_the_hugging_face_layout():
    """q, k, v as transformers hands them over (transpose(1, 2) of [B, N, H, D] tensors): the
    output, laid out in q's order, is written in place by the Gluon kernel on the e4m3 tiles
    and equals the output for contiguous inputs."""

    def fp8(q, k, v):
        q, k = (af.quantize_fp8(af.rope(x, theta=500000.0), block=128) for x in (q, k))
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), af.quantize_fp8(v, block=128))

    var = af.Variant(fp8)
    q, k, v = _inputs(16, 4, 2048, 2048, 128, torch.bfloat16, seed=5)
    views = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    with torch.no_grad(), af.backend("triton"):
        want = var(q, k, v)
        got = var(*views)
        assert "_gluon_attention(q8, k8, v8" in var.compile(*views).source
    assert got.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
