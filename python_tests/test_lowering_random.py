"""Random compositions of the building blocks, lowered and run under the Triton
interpreter against the reference executor (hypothesis, derandomized: the same
examples on every run, so CI stays reproducible and its time bounded).

Each example draws the shapes (GQA, head dims, Dv, Nq <= Nk), the pre-matmul chains
(QK-norm with or without weights, RoPE of either style and partial rotary, scales),
a score chain in random order (scale, softcap, ALiBi, causal, sliding window,
prefix-LM, document mask), an optional sink, the rope-fusion mode and the tiles.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_harness import check, qkv, variant

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")


@st.composite
def compositions(draw):
    dtype = draw(st.sampled_from([torch.float16, torch.float32]))
    hkv = draw(st.sampled_from([1, 2]))
    hq = hkv * draw(st.sampled_from([1, 2]))
    d = draw(st.sampled_from([16, 32, 48]))
    dv = draw(st.sampled_from([d, 16, 24]))
    nk = draw(st.integers(1, 70))
    nq = draw(st.integers(1, nk))
    b = draw(st.integers(1, 2))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    extras, args = [], []

    def tensor(decl: str, value: torch.Tensor) -> None:
        extras.append(decl)
        args.append(value)

    rope = None
    if draw(st.booleans()):
        style = draw(st.sampled_from(["half", "interleaved"]))
        rdim = draw(st.sampled_from([d, d // 2]))
        rope = f"attn.rope {{x}} {style} theta = 10000.0 rotary_dim = {rdim}"
    chains = []
    for side in ("q", "k"):
        ops = []
        if draw(st.booleans()):
            if draw(st.booleans()):
                tensor(f"%{side}w: tensor<{d}x{{E}}>", (torch.rand(d, generator=gen) + 0.5).to(dtype))
                ops.append(f"attn.norm {{x}} eps = 1.0e-06 weight(%{side}w : tensor<{d}x{{E}}>)")
            else:
                ops.append("attn.norm {x} eps = 1.0e-06")
        if rope is not None and (side == "k" or draw(st.booleans())):
            ops.append(rope)
        if draw(st.booleans()):
            ops.append(f"attn.scale {{x}} value = {draw(st.sampled_from([0.5, 1.5, -1.0]))}")
        chains.append(ops)

    blocks = draw(
        st.lists(
            st.sampled_from(["scale", "softcap", "alibi", "causal", "window", "prefix", "document"]),
            unique=True,
            max_size=4,
        )
    )
    score_ops = []
    for block in draw(st.permutations(blocks)):
        if block == "scale":
            score_ops.append("attn.scale {s} value = 1.25")
        elif block == "softcap":
            score_ops.append("attn.softcap {s} cap = 4.0")
        elif block == "alibi":
            tensor(f"%slopes: tensor<{hq}xf32>", torch.rand(hq, generator=gen) * 0.5)
            score_ops.append(f"attn.bias {{s}} alibi(%slopes : tensor<{hq}xf32>)")
        elif block == "causal":
            score_ops.append("attn.mask {s} causal")
        elif block == "window":
            score_ops.append(f"attn.mask {{s}} sliding_window({draw(st.integers(1, 40))})")
        elif block == "prefix":
            score_ops.append(f"attn.mask {{s}} prefix_lm({draw(st.integers(0, 40))})")
        else:
            ids = (torch.rand(b, nk, generator=gen) < 0.1).cumsum(1).to(torch.int32)
            tensor("%ids: tensor<?x?xi32>", ids)
            score_ops.append("attn.mask {s} document(%ids : tensor<?x?xi32>)")
    softmax = ""
    if draw(st.booleans()):
        tensor(f"%sink: tensor<{hq}xf32>", torch.randn(hq, generator=gen))
        softmax = f"sink(%sink : tensor<{hq}xf32>)"

    ir = variant(
        dtype=dtype,
        hq=hq,
        hkv=hkv,
        d=d,
        dv=dv,
        q_ops=chains[0],
        k_ops=chains[1],
        score_ops=score_ops,
        softmax=softmax,
        extras=extras,
    )
    inputs = qkv(b=b, hq=hq, hkv=hkv, nq=nq, nk=nk, d=d, dv=dv, dtype=dtype, seed=draw(st.integers(0, 99)))
    options = {
        "rope_mode": draw(st.sampled_from(["fused", "prerotate"])),
        "block_m": draw(st.sampled_from([16, 32, 64])),
        "block_n": draw(st.sampled_from([16, 32, 64])),
    }
    return ir, inputs + args, options


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(compositions())
def test_random_compositions(tmp_path_factory, case):
    ir, args, options = case
    check(ir, args, tmp_path_factory.getbasetemp(), **options)
