"""Packed sequences of different lengths (`Variant.varlen`) on CPU: the generated varlen kernel
under the interpreter and the reference backend, forward and backward, against the contract:
each sequence's ordinary call on it alone (float64 reference), with empty sequences, lengths
off the tiles, fewer queries than keys, every variant family whose extras are not per token;
and the errors of bad input."""

from __future__ import annotations

import pytest
import torch
from variant_families import families, small_window

import attnfuse as af
from attnfuse import variants

D = 32


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _families(hq: int) -> list[tuple[af.Variant, tuple]]:
    """The named variants of `variant_families` (whose extras are not per token)."""
    return families(hq, D, seed=11)[:6]


def _packed(lq, lk, hq=4, hkv=2, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)

    return randn(sum(lq), hq, D), randn(sum(lk), hkv, D), randn(sum(lk), hkv, D)


def _expected(var, q, k, v, lq, lk, extras, dtype=torch.float64):
    """The ordinary call per sequence (reference backend), packed back: [total_q, Hq, Dv]."""
    cq, ck = _cu(lq).tolist(), _cu(lk).tolist()
    parts = []
    for s in range(len(lq)):
        args = (
            t.transpose(0, 1)[None].to(dtype)
            for t in (q[cq[s] : cq[s + 1]], k[ck[s] : ck[s + 1]], v[ck[s] : ck[s + 1]])
        )
        ex = [x.to(dtype) if x.is_floating_point() else x for x in extras]
        with af.backend("reference"):
            parts.append(var(*args, *ex)[0].transpose(0, 1))
    return torch.cat(parts)


LENGTHS = [([37, 0, 1, 64, 5], None), ([3, 20, 9], [17, 20, 40])]


@pytest.mark.parametrize("lengths", range(len(LENGTHS)))
@pytest.mark.parametrize("family", range(6))
def test_forward_every_family(family, lengths):
    var, extras = _families(4)[family]
    lq, lk = LENGTHS[lengths]
    lk = lk or lq
    q, k, v = _packed(lq, lk, dtype=torch.float16)
    with af.backend("interpret"):
        out = var.varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), *extras)
    want = _expected(var, q, k, v, lq, lk, extras)
    assert out.shape == want.shape and out.dtype == torch.float16
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-2)


def test_strided_cu_seqlens():
    """cu_seqlens given as strided views: the same output as contiguous ones."""
    var, extras = _families(4)[0]
    lq, lk = LENGTHS[1]
    q, k, v = _packed(lq, lk, dtype=torch.float16)
    cu_q, cu_k = (torch.stack([_cu(x), _cu(x)], 1)[:, 1] for x in (lq, lk))
    assert cu_q.stride() == (2,)
    with af.backend("interpret"):
        out = var.varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), *extras)
    torch.testing.assert_close(out.double(), _expected(var, q, k, v, lq, lk, extras), rtol=0, atol=2e-2)


@pytest.mark.parametrize(("family", "lengths"), [(0, 0), (3, 0), (5, 0), (2, 1), (4, 1)])
def test_backward(family, lengths):
    """Gradients of q, k, v and of shared extras (QK-norm weights, sinks) through the varlen
    backward kernels match autograd of the per-sequence reference in float64 (lengths off the
    tiles, a sequence with no queries, one with more queries than keys)."""
    var, extras = _families(4)[family]
    lq, lk = [([3, 20, 0, 9], [17, 20, 4, 40]), ([40, 5, 33], [7, 5, 70])][lengths]
    q, k, v = _packed(lq, lk, grad=True)
    learned = family in (3, 5)  # QK-norm weights, sinks (ALiBi slopes have no gradient)
    extras = tuple(x.clone().requires_grad_(learned and x.is_floating_point()) for x in extras)
    with af.backend("interpret"):
        out = var.varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), *extras)
    g = torch.randn_like(out)
    wrt = [q, k, v, *(x for x in extras if x.requires_grad)]
    got = torch.autograd.grad(out, wrt, g)
    ref_in = [t.detach().double().requires_grad_() for t in wrt]
    rq, rk, rv, *rex = ref_in
    rex_iter = iter(rex)
    ref_extras = tuple(next(rex_iter) if x.requires_grad else x for x in extras)
    want = torch.autograd.grad(_expected(var, rq, rk, rv, lq, lk, ref_extras), ref_in, g.double())
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_reference_backend_and_bfloat16():
    lq = [9, 30]
    q, k, v = _packed(lq, lq, dtype=torch.bfloat16)
    want = _expected(variants.llama3, q, k, v, lq, lq, ())
    for backend in ("reference", "interpret"):
        with af.backend(backend):
            out = variants.llama3.varlen(q, k, v, _cu(lq), _cu(lq), 30, 30)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.double(), want, rtol=0, atol=3e-2)


def test_all_sequences_empty_or_none():
    q, k, v = _packed([0, 0], [0, 0])
    with af.backend("interpret"):
        assert variants.llama3.varlen(q, k, v, _cu([0, 0]), _cu([0, 0]), 0, 0).shape == (0, 4, D)
        one = torch.zeros(1, dtype=torch.int32)
        assert variants.llama3.varlen(q, k, v, one, one, 0, 0).shape == (0, 4, D)


@pytest.mark.parametrize(("d", "dv"), [(16, 16), (48, 40), (80, 96)])
def test_head_dims_and_lengths_given_as_numbers(d, dv):
    """Head dims off the powers of two, Dv != D, GQA; max lengths as a numpy integer or a tensor."""
    import numpy as np

    g = torch.Generator().manual_seed(d)
    lq = [7, 30]
    q, k, v = (torch.randn(37, h, n, generator=g) for h, n in ((6, d), (3, d), (3, dv)))
    with af.backend("interpret"):
        out = variants.llama3.varlen(q, k, v, _cu(lq), _cu(lq), np.int64(30), torch.tensor(30))
    torch.testing.assert_close(out.double(), _expected(variants.llama3, q, k, v, lq, lq, ()), rtol=0, atol=1e-4)


def test_sequences_without_keys_give_zeros():
    lq, lk = [4, 6], [0, 6]
    q, k, v = _packed(lq, lk)
    with af.backend("interpret"):
        out = variants.mistral.varlen(q, k, v, _cu(lq), _cu(lk), 6, 6)
    assert (out[:4] == 0).all()
    torch.testing.assert_close(
        out[4:].double(), _expected(variants.mistral, q, k, v, lq, lk, ())[4:], atol=1e-4, rtol=0
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "cq": torch.tensor([0, 5, 3, 10], dtype=torch.int32)}, "never decrease"),
        (lambda a: {**a, "cq": torch.tensor([1, 5, 8, 10], dtype=torch.int32)}, "must start at 0"),
        (lambda a: {**a, "cq": torch.tensor([0, 5, 8, 9], dtype=torch.int32)}, "end at the packed q's 10 tokens"),
        (lambda a: {**a, "cq": a["cq"].long()}, "cu_seqlens_q must be an int32 tensor"),
        (lambda a: {**a, "ck": torch.tensor([0, 10], dtype=torch.int32)}, "the same number of sequences"),
        (lambda a: {**a, "mq": 4}, "past max_seqlen_q = 4"),
        (lambda a: {**a, "mq": -1}, "max_seqlen_q must be a non-negative int"),
        (lambda a: {**a, "q": a["q"][None]}, r"q must be a packed tensor \[total, H, D\]"),
        (lambda a: {**a, "k": a["k"][:, :, :16], "v": a["v"][:, :, :16]}, "k has head dim 16 but q has 32"),
        (lambda a: {**a, "q": torch.randn(10, 3, D)}, "not a multiple of k's 2"),
    ],
)
def test_bad_input(change, message):
    q, k, v = _packed([5, 3, 2], [5, 3, 2])
    a = change({"q": q, "k": k, "v": v, "cq": _cu([5, 3, 2]), "ck": _cu([5, 3, 2]), "mq": 5})
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match=message):
        variants.llama3.varlen(a["q"], a["k"], a["v"], a["cq"], a["ck"], a["mq"], 5)


def test_a_gradient_the_compiler_cannot_form_is_named():
    q, k, v = _packed([5, 3], [5, 3], grad=True)
    slopes = af.alibi_slopes(4).requires_grad_()
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match="slopes requires grad"):
        variants.bloom.varlen(q, k, v, _cu([5, 3]), _cu([5, 3]), 5, 5, slopes)


def test_per_token_extras_are_refused():
    q, k, v = _packed([5, 3], [5, 3])
    ids = torch.zeros(1, 8, dtype=torch.int32)
    with af.backend("interpret"), pytest.raises(af.AttnFuseError, match="no per-token extras .*document ids"):
        variants.packed_documents.varlen(q, k, v, _cu([5, 3]), _cu([5, 3]), 5, 5, ids)


def test_varlen_kernels_compile_for_sm90(tmp_path):
    """The varlen forward and backward kernels compile for sm 90 on the CPU (Triton's compiler and
    ptxas) with the tiling's launch shapes, within one SM's shared memory."""
    from kernel_harness import compile_for_sm90

    from attnfuse.cache import load_source
    from attnfuse.compiler import compile_module

    q = torch.zeros(1, 8, 300, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 300, 128, dtype=torch.bfloat16)
    module = variants.llama3.ir_module(q, k, k)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    pos = torch.zeros(300, dtype=torch.int32)
    calls = []
    for direction, args in (
        ("fwd", (q, k, k, cu, cu, 200)),
        ("bwd", (q, k, k, q, torch.zeros(1, 8, 300), q, cu, cu, 200, 200, pos, pos)),
    ):
        source = compile_module(module, sm=90, direction=direction, varlen=True).source
        mod = load_source(source, tmp_path, interpret=False)
        mod._launch = lambda kernel, grid, warps, stages, *a: calls.append((kernel, warps, stages, a))
        mod.launch(*args)
    names = set()
    for kernel, warps, stages, a in calls:
        binary = compile_for_sm90(kernel, a, num_warps=warps, num_stages=stages)
        assert binary.metadata.shared <= 232448, (kernel.__name__, binary.metadata.shared)
        names.add(kernel.__name__)
    assert names == {"attn_fwd", "attn_bwd_pre", "rotate_q", "rotate_k", "attn_bwd_dkdv", "attn_bwd_dq"}


def test_boundaries_in_one_batch():
    """One packed batch holding the boundary cases, forward and backward: lengths around the
    interpreter's tiles (31-33, 63-65) and Nk - Nq at every offset across a 32-key tile (0-32,
    queries 3), with a 20-key window (and softcap) crossing block edges. Two query heads on one
    KV head (GQA 2:1; the other tests cover 4 on 2): the interpreter's time grows with the heads."""
    var, extras = small_window, ()
    lq = [31, 32, 33, 63, 64, 65, *([3] * 33)]
    lk = [31, 32, 33, 63, 64, 65, *(3 + off for off in range(33))]
    q, k, v = _packed(lq, lk, hq=2, hkv=1, grad=True)
    with af.backend("interpret"):
        out = var.varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), *extras)
    rq, rk, rv = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = _expected(var, rq, rk, rv, lq, lk, extras)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-4)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    ref = torch.autograd.grad(want, (rq, rk, rv), g.double())
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
