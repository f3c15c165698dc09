"""Packed sequences on the GPU (`Variant.varlen`, triton backend): the varlen forward kernel and
the per-sequence backward at Llama-3-8B's heads and gpt-oss's (sinks, D 64), bf16, lengths of 0,
1 and off the tiles, fewer queries than keys; against each sequence's ordinary call."""

from __future__ import annotations

import pytest
import torch

import attnfuse as af
from attnfuse import variants

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


CASES = [
    (variants.llama3, lambda: (), 32, 8, 128),
    (variants.qwen3, lambda: (torch.rand(128, device="cuda") + 0.5, torch.rand(128, device="cuda") + 0.5), 32, 8, 128),
    (variants.gpt_oss, lambda: (torch.randn(16, device="cuda"),), 16, 2, 64),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("queries", ["all", "last"])
def test_varlen_matches_each_sequence(case, queries):
    var, make_extras, hq, hkv, d = CASES[case]
    torch.manual_seed(case)
    lk = [1000, 1, 0, 2048, 77]
    lq = lk if queries == "all" else [min(n, m) for n, m in zip(lk, [100, 1, 0, 2048, 13], strict=True)]
    extras = tuple(x.requires_grad_() if x.dim() == 1 else x for x in make_extras())
    q = torch.randn(sum(lq), hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(sum(lk), hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(sum(lk), hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with af.backend("triton"):
        out = var.varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), *extras)
    g = torch.randn_like(out)
    wrt = [q, k, v, *extras]
    got = torch.autograd.grad(out, wrt, g)
    cq, ck = _cu(lq).tolist(), _cu(lk).tolist()
    ref_in = [t.detach().float().requires_grad_() for t in wrt]
    parts = []
    for s in range(len(lq)):
        rq = ref_in[0][cq[s] : cq[s + 1]].transpose(0, 1)[None]
        rk = ref_in[1][ck[s] : ck[s + 1]].transpose(0, 1)[None]
        rv = ref_in[2][ck[s] : ck[s + 1]].transpose(0, 1)[None]
        with af.backend("reference"):
            parts.append(var(rq, rk, rv, *ref_in[3:])[0].transpose(0, 1))
    ref = torch.cat(parts)
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=3e-2)
    want = torch.autograd.grad(ref, ref_in, g.float())
    for name, a, b in zip(["dq", "dk", "dv", "dextra", "dextra2"], got, want, strict=False):
        err = (a.float() - b).abs().max().item()
        assert err <= 5e-2 * max(1.0, b.abs().max().item()), (name, err)


def test_boundaries_in_one_batch():
    """Lengths around the GPU tiles (63-65, 127-129) and Nk - Nq at every offset across a 128-key
    tile (queries 5), forward and backward, Llama-3-8B heads, bf16, against each sequence's
    ordinary call in float32."""
    lq = [63, 64, 65, 127, 128, 129, *([5] * 129)]
    lk = [63, 64, 65, 127, 128, 129, *(5 + off for off in range(129))]
    torch.manual_seed(3)
    q = torch.randn(sum(lq), 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(sum(lk), 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(sum(lk), 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with af.backend("triton"):
        out = variants.llama3.varlen(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk))
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    cq, ck = _cu(lq).tolist(), _cu(lk).tolist()
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    parts = []
    for s in range(len(lq)):
        rows = [
            t[a:b].transpose(0, 1)[None]
            for t, (a, b) in zip(ref_in, [(cq[s], cq[s + 1])] + [(ck[s], ck[s + 1])] * 2, strict=True)
        ]
        with af.backend("reference"):
            parts.append(variants.llama3(*rows)[0].transpose(0, 1))
    ref = torch.cat(parts)
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=3e-2)
    for a, b in zip(got, torch.autograd.grad(ref, ref_in, g.float()), strict=True):
        assert (a.float() - b).abs().max().item() <= 5e-2 * max(1.0, b.abs().max().item())
