"""`layout=` of a variant call: "bhnd" (tensors [B, H, N, D], the default) or "bnhd"
(tensors [B, N, H, D], FlashAttention's and Hugging Face's layout). A bnhd call must equal
the bhnd call of the transposed tensors, forward and gradients, return its output in the
caller's layout, and errors about heads must name both layouts."""

from __future__ import annotations

import pytest
import torch

import attnfuse as af
from attnfuse import runtime


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNFUSE_BACKEND", raising=False)
    runtime.clear_caches()
    yield
    runtime.clear_caches()


@af.variant
def rope_window(q, k, v, window):
    q, k = af.rope(q), af.rope(k)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.sliding_window(window))), v)


def bnhd(b=2, hq=4, hkv=2, nq=12, nk=20, d=16, seed=0):
    """q, k, v in [B, N, H, D], leaves requiring grad."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, nq, hq, d), (b, nk, hkv, d), (b, nk, hkv, d)]
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def grads(out, *inputs):
    weight = torch.linspace(-1, 1, out.numel()).view(out.shape)
    return torch.autograd.grad((out * weight).sum(), inputs)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_bnhd_equals_bhnd_of_the_transposed_tensors(backend):
    q, k, v = bnhd()
    with af.backend(backend):
        out = rope_window(q, k, v, 5, layout="bnhd")
        tq, tk, tv = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        want = rope_window(tq, tk, tv, 5)
    assert out.shape == (2, 12, 4, 16)  # [B, Nq, Hq, Dv]: the caller's layout
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=0, atol=0)
    got, expected = grads(out, q, k, v), grads(want.transpose(1, 2), tq, tk, tv)
    for x, g, e in zip((q, k, v), got, expected, strict=True):
        assert g.shape == x.shape  # the gradient in the input's own layout
        torch.testing.assert_close(g, e.transpose(1, 2), rtol=1e-6, atol=1e-6)
    assert all(x.grad is None for x in (q, k, v))


def test_bnhd_under_torch_compile_fullgraph():
    q, k, v = bnhd()
    torch.compiler.reset()
    try:
        compiled = torch.compile(
            lambda q, k, v: rope_window(q, k, v, 5, layout="bnhd"), fullgraph=True, backend="aot_eager"
        )
        with af.backend("reference"):
            out = compiled(q, k, v)
            torch.testing.assert_close(out, rope_window(q, k, v, 5, layout="bnhd"))
    finally:
        torch.compiler.reset()
    assert out.shape == (2, 12, 4, 16)


def test_an_unknown_layout_lists_both():
    q, k, v = bnhd()
    with pytest.raises(
        af.AttnFuseError,
        match=r"layout must be 'bhnd' \(tensors \[B, H, N, D\], the default\) or "
        r"'bnhd' \(tensors \[B, N, H, D\]\), got 'BNHD'",
    ):
        rope_window(q, k, v, 5, layout="BNHD")


def test_head_errors_name_both_layouts():
    q, k, v = bnhd(nq=12, nk=20)  # read as [B, H, N, D]: 12 query heads, 20 kv heads
    with pytest.raises(
        af.AttnFuseError,
        match=r"q has 12 heads, which is not a multiple of k's 20 heads \(GQA needs Hq % Hkv == 0; heads are dim 1 "
        r"of \[B, H, N, D\], layout='bhnd'; if your tensors are \[B, N, H, D\], pass layout='bnhd'\)",
    ):
        rope_window(q, k, v, 5)
    q, k, v = (x.detach().transpose(1, 2) for x in bnhd(hq=3))  # [B, H, N, D] given as bnhd
    with pytest.raises(
        af.AttnFuseError,
        match=r"q has 12 heads, which is not a multiple of k's 20 heads .*heads are dim 2 of \[B, N, H, D\], "
        r"layout='bnhd'; if your tensors are \[B, H, N, D\], pass layout='bhnd'\)",
    ):
        rope_window(q, k, v, 5, layout="bnhd")
    q, k, v = bnhd()
    with pytest.raises(af.AttnFuseError, match=r"v has 3 heads but k has 2: .*dim 2 of \[B, N, H, D\]"):
        rope_window(q, k, torch.randn(2, 20, 3, 16), 5, layout="bnhd")
    with pytest.raises(af.AttnFuseError, match=r"k must have rank 4 \[B, N, H, D\], got shape \[2, 20, 32\]"):
        rope_window(q, torch.randn(2, 20, 32), v, 5, layout="bnhd")


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_the_output_is_laid_out_in_the_order_of_the_queries(backend):
    """As SDPA lays out its output: for q seen through transpose(1, 2) of a [B, N, H, D] tensor
    (how Hugging Face models hand q over) the output's transpose back is contiguous, so the
    model's reshape to [B, N, H·D] copies nothing (and its o_proj saves no second copy of the
    output); for a contiguous q it is contiguous. The values are the same either way, eager and
    through the custom op torch.compile traces, whose fake output has the real one's strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attnfuse import autograd

    q, k, v = (x.detach() for x in bnhd())
    views = [x.transpose(1, 2) for x in (q, k, v)]
    with af.backend(backend):
        plain = rope_window(*(x.contiguous() for x in views), 5)
        eager = rope_window(*views, 5)
        key = autograd._site_key(rope_window._handle, ((False, 5),))
        real = torch.ops.attnfuse.attention.default(key, *views, [])[0]
        mode = FakeTensorMode()
        fakes = [mode.from_tensor(x) for x in views]
        with mode:
            fake = torch.ops.attnfuse.attention.default(key, *fakes, [])[0]
        caller = rope_window(q, k, v, 5, layout="bnhd")
    assert plain.is_contiguous() and real.transpose(1, 2).is_contiguous()
    assert fake.shape == real.shape and fake.stride() == real.stride()
    if backend == "interpret":  # the kernel's launcher (the reference executor's eager output is its own)
        assert eager.transpose(1, 2).is_contiguous() and caller.is_contiguous()
    for out in (eager, real, caller.transpose(1, 2)):
        torch.testing.assert_close(out, plain, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_the_gradients_are_laid_out_in_the_order_of_their_inputs(backend):
    """As SDPA lays out its gradients: for q, k and v seen through transpose(1, 2) of [B, N, H, D]
    tensors, each gradient's transpose back is contiguous (the layers before take it without a
    copy); for contiguous inputs they are contiguous. The values equal those of contiguous
    inputs, and the backward custom op's fake gradients have the real ones' strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attnfuse import autograd

    q, k, v = (x.detach() for x in bnhd())
    views = [x.transpose(1, 2) for x in (q, k, v)]
    dense = [x.contiguous() for x in views]
    with af.backend(backend):
        key = autograd._site_key(rope_window._handle, ((False, 5),))
        out, lse = torch.ops.attnfuse.attention.default(key, *views, [])
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        real = torch.ops.attnfuse.attention_backward.default(key, [0, 1, 2], *views, [], out, lse, dout)
        want = torch.ops.attnfuse.attention_backward.default(key, [0, 1, 2], *dense, [], out.contiguous(), lse, dout)
        mode = FakeTensorMode()
        with mode:
            fakes = [mode.from_tensor(x) for x in (*views, out, lse, dout)]
            fake = torch.ops.attnfuse.attention_backward.default(key, [0, 1, 2], *fakes[:3], [], *fakes[3:])
    for g, f, w in zip(real, fake, want, strict=True):
        assert g.transpose(1, 2).is_contiguous() and w.is_contiguous()
        assert f.shape == g.shape and f.stride() == g.stride()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
