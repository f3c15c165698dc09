"""Decoding against a KV cache on the GPU (`Variant.decode`, triton backend): the generated
split-KV and combine kernels at Llama-3-8B's heads (Hq 32, Hkv 8, D 128) and Gemma 2's
(softcap, window, D 256), contiguous and paged, bf16 and fp16, against each sequence's
ordinary call (the reference executor in float32), with NaN in every unused slot."""

from __future__ import annotations

import pytest
import torch

import attnfuse as af
from attnfuse import variants

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _table(b: int, s: int, page: int, g: torch.Generator) -> torch.Tensor:
    per = -(-s // page)
    return torch.randperm(b * per + 3, generator=g)[: b * per].view(b, per).to(torch.int32)


def _paged(cache: torch.Tensor, table: torch.Tensor, page: int) -> torch.Tensor:
    b, h, s, d = cache.shape
    per = table.shape[1]
    pool = torch.full((table.numel() + 3, page, h, d), float("nan"), dtype=cache.dtype, device=cache.device)
    padded = torch.full((b, h, per * page, d), float("nan"), dtype=cache.dtype, device=cache.device)
    padded[:, :, :s] = cache
    pool[table.long().flatten()] = padded.view(b, h, per, page, d).permute(0, 2, 3, 1, 4).reshape(-1, page, h, d)
    return pool


CASES = [
    # (variant, extras maker, hq, hkv, d, dtype)
    (variants.llama3, lambda hq, d, dev: (), 32, 8, 128, torch.bfloat16),
    (
        variants.qwen3,
        lambda hq, d, dev: (torch.rand(d, device=dev) + 0.5, torch.rand(d, device=dev) + 0.5),
        32,
        8,
        128,
        torch.bfloat16,
    ),
    (variants.gpt_oss, lambda hq, d, dev: (torch.randn(hq, device=dev),), 16, 2, 64, torch.float16),
    (variants.gemma2, lambda hq, d, dev: (), 16, 8, 256, torch.bfloat16),
    (variants.bloom, lambda hq, d, dev: (af.alibi_slopes(hq).to(dev),), 8, 8, 64, torch.float16),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("page", [None, 16, 64, 256])
@pytest.mark.parametrize("lq", [1, 4])
def test_decode_matches_the_ordinary_call(case, page, lq):
    var, make_extras, hq, hkv, d, dtype = CASES[case]
    dev = "cuda"
    g = torch.Generator().manual_seed(case * 10 + lq)
    lens = [5000, 1, 0, 777, 4096 + 3]
    b, s = len(lens), 5120
    torch.manual_seed(case)
    extras = make_extras(hq, d, dev)
    q = torch.randn(b, hq, lq, d, device=dev, dtype=dtype)
    k_raw = torch.randn(b, hkv, s, d, device=dev, dtype=dtype)
    v = torch.randn(b, hkv, s, d, device=dev, dtype=dtype)
    k_cache = var.cache_keys(k_raw, torch.arange(s, device=dev), *extras).clone()
    v_cache = v.clone()
    for i, n in enumerate(lens):
        k_cache[i, :, n:] = float("nan")
        v_cache[i, :, n:] = float("nan")
    table = None
    if page is not None:
        table = _table(b, s, page, g).to(dev)
        k_cache, v_cache = _paged(k_cache, table, page), _paged(v_cache, table, page)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    with af.backend("triton"):
        out = var.decode(q, k_cache, v_cache, seqlens, *extras, page_table=table)
    assert torch.isfinite(out).all()
    for i, n in enumerate(lens):
        with af.backend("reference"):
            want = var(q[i : i + 1].float(), k_raw[i : i + 1, :, :n].float(), v[i : i + 1, :, :n].float(), *extras)
        torch.testing.assert_close(out[i : i + 1].float(), want, rtol=0, atol=3e-2)


def test_cuda_graph_capture():
    """decode(check=False) captures into a CUDA graph and replays with new lengths."""
    dev = "cuda"
    q = torch.randn(2, 32, 1, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(2, 8, 2048, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.tensor([100, 2000], dtype=torch.int32, device=dev)
    with af.backend("triton"):
        variants.llama3.decode(q, k, v, lens, check=False)  # compile and warm up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = variants.llama3.decode(q, k, v, lens, check=False)
        lens.copy_(torch.tensor([2048, 7], dtype=torch.int32))
        graph.replay()
        want = variants.llama3.decode(q, k, v, lens)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_torch_compile_cuda_graphs():
    """torch.compile(mode="reduce-overhead", fullgraph=True) of a decode step (one
    attnfuse::decode node, replayed as a CUDA graph) gives the eager call's output for new lengths."""
    dev = "cuda"
    q = torch.randn(2, 32, 1, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(2, 8, 2048, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    with af.backend("triton"):
        step = torch.compile(
            lambda q, k, v, lens: variants.llama3.decode(q, k, v, lens), mode="reduce-overhead", fullgraph=True
        )
        for lens in ([100, 2000], [2048, 7], [1, 1024]):
            lens = torch.tensor(lens, dtype=torch.int32, device=dev)
            want = variants.llama3.decode(q, k, v, lens)
            for _ in range(3):  # warm-up, record, replay
                got = step(q, k, v, lens)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
