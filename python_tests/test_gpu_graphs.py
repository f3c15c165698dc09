"""AttnFuse calls under CUDA-graph capture (`torch.cuda.graph`), on the `triton` backend.

After a warm-up call (which compiles, loads the binary and builds RoPE tables, as every
CUDA-graph user warms up), a call must capture: no host synchronisation, no allocation
outside the graph's pool, no launch that bypasses the capturing stream. A replay with new
data in the captured inputs must then give what an eager call on that data gives, to the
bit (same kernels, same inputs). Forward for each named variant family and explicit RoPE
positions, forward and backward for Llama-3 and Qwen3 (learned QK-norm weights), and the
forward through the sm90 Gluon kernel.

Marked `gpu`, skipped without CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

import attnfuse as af
from attnfuse import variants
from attnfuse.runtime import device_sm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

B, N, D = 2, 200, 128


@af.variant
def rope_at_positions(q, k, v, pos):
    q = af.rope(q, theta=500000.0, positions=pos)
    k = af.rope(k, theta=500000.0, positions=pos)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def _inputs(hq: int, hkv: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, h, N, D, device="cuda", dtype=dtype, generator=g) for h in (hq, hkv, hkv)]


def _extras(name: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed + 100)
    if name == "qwen3":
        return [1 + 0.1 * torch.randn(D, device="cuda", generator=g) for _ in range(2)]
    if name == "bloom":
        return [variants.alibi_slopes(32).cuda()]
    if name == "gpt_oss":
        return [torch.randn(32, device="cuda", generator=g)]
    if name == "packed_documents":
        return [torch.sort(torch.randint(0, 4, (B, N), device="cuda", generator=g), dim=1).values.to(torch.int32)]
    if name == "rope_at_positions":
        return [torch.randint(0, 100_000, (B, N), device="cuda", generator=g)]
    return []


CASES: dict[str, Callable[..., torch.Tensor]] = {
    "llama3": variants.llama3,
    "mistral": variants.mistral,
    "gemma2": variants.gemma2,
    "qwen3": variants.qwen3,
    "bloom": variants.bloom,
    "gpt_oss": variants.gpt_oss,
    "packed_documents": variants.packed_documents,
    "rope_at_positions": rope_at_positions,
}


def _captured(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """fn warmed up on a side stream (compiles and caches everything), then captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _replay(graph: torch.cuda.CUDAGraph, static: Sequence[torch.Tensor], fresh: Sequence[torch.Tensor]) -> None:
    """Copy `fresh` into the captured inputs, replay the graph and wait for it."""
    with torch.no_grad():
        for s, f in zip(static, fresh, strict=True):
            s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()


@pytest.mark.parametrize("name", list(CASES))
def test_forward_captures_and_replays(name: str) -> None:
    f = CASES[name]
    static = [*_inputs(32, 8, seed=1), *_extras(name, seed=1)]
    result: list[torch.Tensor] = []

    def call() -> None:
        result[:] = [f(*static)]

    graph = _captured(call)
    for seed in (2, 3):
        fresh = [*_inputs(32, 8, seed=seed), *_extras(name, seed=seed)]
        _replay(graph, static, fresh)
        expected = f(*fresh)
        assert torch.isfinite(expected).all()
        assert torch.equal(result[0], expected), f"{name}: the replayed graph differs from an eager call (seed {seed})"


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_forward_and_backward_capture_and_replay(name: str) -> None:
    f = CASES[name]
    static = [x.requires_grad_() for x in (*_inputs(32, 8, seed=1), *_extras(name, seed=1))]
    dout = torch.randn(B, 32, N, D, device="cuda", dtype=torch.bfloat16)
    result: list[torch.Tensor] = []

    def step() -> None:
        out = f(*static)
        result[:] = [out.detach(), *torch.autograd.grad(out, static, dout)]

    graph = _captured(step)
    for seed in (2, 3):
        fresh = [*_inputs(32, 8, seed=seed), *_extras(name, seed=seed)]
        _replay(graph, static, fresh)
        leaves = [x.detach().clone().requires_grad_() for x in fresh]
        out = f(*leaves)
        expected = [out.detach(), *torch.autograd.grad(out, leaves, dout)]
        names = ["out"] + [f"d{n}" for n in ("q", "k", "v", "w_q", "w_k")][: len(leaves)]
        for what, got, want in zip(names, result, expected, strict=True):
            assert torch.isfinite(want).all(), f"{name}: {what} is not finite"
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m, w=what: f"{name} {w}: {m}")


@pytest.mark.skipif(torch.cuda.is_available() and device_sm() != 90, reason="the Gluon kernel is sm 90's")
def test_gluon_forward_captures_and_replays() -> None:
    """Llama 3 at N = 4096 takes the sm90 Gluon kernel (after its first launches); captured,
    its replays equal eager calls on the new inputs, to the bit."""
    g = torch.Generator(device="cuda").manual_seed(1)
    static = [torch.randn(1, h, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for h in (32, 8, 8)]
    assert "_gluon_attention(" in variants.llama3.compile(*static).source
    result: list[torch.Tensor] = []

    def call() -> None:
        result[:] = [variants.llama3(*static)]

    graph = _captured(call)
    for seed in (2, 3):
        g.manual_seed(seed)
        fresh = [torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=g) for x in static]
        _replay(graph, static, fresh)
        assert torch.equal(result[0], variants.llama3(*fresh)), f"replay {seed} differs from an eager call"
