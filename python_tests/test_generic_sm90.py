"""The generic Triton kernels compiled for sm 90 without a GPU (Triton's compiler and ptxas, no
driver): a softcap's and a score_mod's tanh is the `tanh.approx.f32` instruction in the
forward and in both backward kernels that recompute the scores with kernel-path's
`tanh="approx"`, and nowhere with the default `tanh="auto"` (the generic kernel keeps the exact
form) or `tanh="exact"`. Their results on a GPU are test_gpu_grad.py's."""

from __future__ import annotations

import pytest
import torch
from kernel_harness import compile_for_sm90, variant

from attnfuse.cache import load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module

SCORE_MOD_TANH = """attn.score_mod {s} {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.constant 20.0 : f32
    %y = arith.divf %x, %c : f32
    %t = math.tanh %y : f32
    %z = arith.mulf %t, %c : f32
    attn.yield %z : f32
  }"""
SCORE_OPS = {
    "softcap": ["attn.softcap {s} cap = 30.0", "attn.mask {s} causal"],
    "score_mod": [SCORE_MOD_TANH, "attn.mask {s} causal"],
}


def compiled_kernels(source: str, folder, args: tuple) -> dict[str, str]:
    """Each kernel that `launch(*args)` of the generated `source` runs, compiled for sm 90 as
    that launch would: its name -> PTX."""
    module = load_source(source, folder, interpret=False)
    calls = []
    module._launch = lambda kernel, grid, num_warps, num_stages, *a: calls.append((kernel, num_warps, num_stages, a))
    module.launch(*args)
    ptx = {}
    for kernel, num_warps, num_stages, a in calls:
        binary = compile_for_sm90(kernel, a, num_warps=num_warps, num_stages=num_stages)
        ptx[kernel.__name__] = binary.asm["ptx"]
    return ptx


@pytest.mark.parametrize("tanh", ["approx", "auto", "exact"])
@pytest.mark.parametrize("family", list(SCORE_OPS))
def test_generic_kernels_tanh_for_sm90(family: str, tanh: str, tmp_path) -> None:
    ir = variant(dtype=torch.bfloat16, hq=4, hkv=2, d=64, score_ops=SCORE_OPS[family])
    q, k, v = (torch.zeros(1, h, 256, 64, dtype=torch.bfloat16) for h in (4, 2, 2))
    fwd = compile_module(parse_module(ir), sm=90, seq_len=1024, tanh=tanh).source
    bwd = compile_module(parse_module(ir), sm=90, seq_len=1024, direction="bwd", tanh=tanh).source
    ptx = compiled_kernels(fwd, tmp_path, (q, k, v))
    ptx |= compiled_kernels(bwd, tmp_path, (q, k, v, torch.zeros_like(q), torch.zeros(1, 4, 256), torch.zeros_like(q)))
    assert set(ptx) == {"attn_fwd", "attn_bwd_pre", "attn_bwd_dkdv", "attn_bwd_dq"}
    approx = {name for name, text in ptx.items() if "tanh.approx.f32" in text}
    assert approx == ({"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"} if tanh == "approx" else set())
