"""The Python front end: every block traced into the right attn IR, run through the
reference backend, and checked against the reference executor on the traced IR and
against plain float64 PyTorch formulas (plain_attention.py)."""

from __future__ import annotations

import math

import plain_attention as plain
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnfuse as af
from attnfuse.reference import run_reference

F64 = torch.float64


def rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def qkv(b=2, hq=4, hkv=2, nq=13, nk=21, d=16, dv=8, dtype=torch.float32, seed=0):
    return (
        rand(b, hq, nq, d, dtype=dtype, seed=seed),
        rand(b, hkv, nk, d, dtype=dtype, seed=seed + 1),
        rand(b, hkv, nk, dv, dtype=dtype, seed=seed + 2),
    )


def check(variant: af.Variant, args: tuple, expected: torch.Tensor | None, atol: float = 2e-5) -> torch.Tensor:
    """Run `variant` on the reference backend; compare with the reference executor
    on its IR (float64) and with the plain formula `expected`."""
    with af.backend("reference"):
        out = variant(*args)
    q, _, v = args[:3]
    assert out.dtype == q.dtype
    assert out.shape == (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    oracle = run_reference(variant.ir_module(*args), *tensors)
    torch.testing.assert_close(out.to(F64), oracle, atol=atol, rtol=1e-4)
    if expected is not None:
        torch.testing.assert_close(oracle, expected, atol=1e-9, rtol=1e-9)
    return out


# --------------------------------------------------------------------------- the contract example


@af.variant
def llama(q, k, v):
    q = af.rope(q, theta=500000.0)
    k = af.rope(k, theta=500000.0)
    s = af.mask(af.qk(q, k), af.causal)
    return af.pv(af.softmax(s), v)


def test_contract_example_ir_and_output():
    q, k, v = qkv(hq=4, hkv=2, nq=9, nk=17, d=16, dv=16)
    qp, kp = plain.positions(9, 17)
    inv = plain.default_inv_freq(500000.0, 16)
    s = plain.scores(plain.rope(q, qp, inv), plain.rope(k, kp, inv))
    keep = kp[None, :] <= qp[:, None]
    check(llama, (q, k, v), plain.finish(s, v, keep))
    text = llama.ir()
    assert "func.func @llama(%q: tensor<?x4x?x16xf32>, %k: tensor<?x2x?x16xf32>, %v: tensor<?x2x?x16xf32>)" in text
    assert text.count("attn.rope") == 2 and "theta = 500000.0 rotary_dim = 16" in text
    assert "attn.mask %s causal" in text
    assert "attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x16xf32> -> tensor<?x4x?x16xf32>" in text


def test_ir_before_any_call_uses_default_signature():
    @af.variant
    def plain_attn(q, k, v):
        return af.pv(af.softmax(af.qk(q, k)), v)

    assert "tensor<?x8x?x64xf16>" in plain_attn.ir()


def test_ir_with_meta_tensors_and_output_type_follows_q():
    q = torch.empty(1, 6, 1, 32, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 2, 1, 32, dtype=torch.bfloat16, device="meta")
    v = torch.empty(1, 2, 1, 48, dtype=torch.bfloat16, device="meta")
    text = llama.ir(q, k, v)
    assert "-> tensor<?x6x?x48xbf16>" in text


# --------------------------------------------------------------------------- every block


def test_rope_styles_partial_rotary_and_scale_prematmul():
    @af.variant
    def v1(q, k, v):
        q = af.scale(af.rope(q, theta=100.0, style="interleaved", rotary_dim=8), 2.0)
        k = af.rope(k, theta=100.0, style="interleaved", rotary_dim=8)
        return af.pv(af.softmax(af.qk(q, k, scale=0.3)), v)

    q, k, v = qkv(d=16)
    qp, kp = plain.positions(q.shape[2], k.shape[2])
    inv = plain.default_inv_freq(100.0, 8)
    s = plain.scores(2.0 * plain.rope(q, qp, inv, "interleaved"), plain.rope(k, kp, inv, "interleaved"), 0.3)
    check(v1, (q, k, v), plain.finish(s, v))
    text = v1.ir()
    assert "attn.rope %q interleaved theta = 100.0 rotary_dim = 8" in text
    assert "attn.scale %q_rope value = 2.0 : tensor<?x4x?x16xf32>" in text
    assert "attn.qk %q_scale, %k_rope scale = 0.3" in text


@pytest.mark.parametrize(
    "scaling, inv_freq",
    [
        (af.linear_scaling(4.0), lambda: (plain.linear_inv_freq(50.0, 16, 4.0), 1.0)),
        (
            {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 64},
            lambda: (plain.llama3_inv_freq(50.0, 16, 4.0, original=64.0), 1.0),
        ),
        (af.yarn_scaling(8.0, 16), lambda: plain.yarn_inv_freq(50.0, 16, 8.0, 16.0)),
        (af.yarn_scaling(8.0, 16, truncate=False), lambda: plain.yarn_inv_freq(50.0, 16, 8.0, 16.0, truncate=False)),
    ],
    ids=["linear", "llama3-dict", "yarn", "yarn-untruncated"],
)
def test_rope_scaling(scaling, inv_freq):
    @af.variant
    def scaled(q, k, v):
        q = af.rope(q, theta=50.0, scaling=scaling)
        k = af.rope(k, theta=50.0, scaling=scaling)
        return af.pv(af.softmax(af.qk(q, k)), v)

    q, k, v = qkv(nq=30, nk=40)
    freqs, mag = inv_freq()
    qp, kp = plain.positions(30, 40)
    s = plain.scores(plain.rope(q, qp, freqs, magnitude=mag), plain.rope(k, kp, freqs, magnitude=mag))
    check(scaled, (q, k, v), plain.finish(s, v))
    assert "scaling = #attn.rope_scaling<" in scaled.ir()


def test_rope_scaling_forms_print_identically():
    hf = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert af.rope_scaling(hf) == af.llama3_scaling()
    assert af.rope_scaling({"type": "linear", "factor": 2}) == af.linear_scaling(2.0)
    assert af.rope_scaling({"rope_type": "default"}) is None
    yarn = af.rope_scaling({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096})
    assert yarn == af.yarn_scaling(32.0, 4096)
    gpt_oss = af.rope_scaling(
        {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "truncate": False}
    )
    assert gpt_oss == af.yarn_scaling(32.0, 4096, truncate=False) != yarn
    assert "truncate = false" in str(gpt_oss) and "truncate = true" in str(yarn)


def test_rope_with_inv_freq_tensor():
    @af.variant
    def explicit(q, k, v, freqs):
        q = af.rope(q, rotary_dim=8, inv_freq=freqs)
        k = af.rope(k, rotary_dim=8, inv_freq=freqs)
        return af.pv(af.softmax(af.qk(q, k)), v)

    q, k, v = qkv(d=16)
    freqs = torch.tensor([1.0, 0.3, 0.05, 0.01])
    qp, kp = plain.positions(q.shape[2], k.shape[2])
    s = plain.scores(plain.rope(q, qp, freqs.double()), plain.rope(k, kp, freqs.double()))
    check(explicit, (q, k, v, freqs), plain.finish(s, v))
    assert "inv_freq(%freqs : tensor<4xf32>)" in explicit.ir()


def test_qk_norm_with_and_without_weight():
    @af.variant
    def normed(q, k, v, w):
        return af.pv(af.softmax(af.qk(af.qk_norm(q, w, eps=1e-5), af.qk_norm(k))), v)

    q, k, v = qkv()
    w = torch.rand(16) + 0.5
    s = plain.scores(plain.rms_norm(q, w, 1e-5), plain.rms_norm(k, None, 1e-6))
    check(normed, (q, k, v, w), plain.finish(s, v))
    text = normed.ir()
    assert "attn.norm %q eps = 1.0e-05 weight(%w : tensor<16xf32>)" in text
    assert "attn.norm %k eps = 1.0e-06 :" in text


def test_named_masks():
    @af.variant
    def masked(q, k, v, ids):
        s = af.mask(af.qk(q, k), af.sliding_window(5))
        s = af.mask(s, af.prefix_lm(3) & af.document(ids))
        return af.pv(af.softmax(s), v)

    q, k, v = qkv(nq=13, nk=21)
    ids = torch.tensor([[0] * 8 + [1] * 13, [0] * 2 + [1] * 19], dtype=torch.int32)
    qp, kp = plain.positions(13, 21)
    d = qp[:, None] - kp[None, :]
    keep = (d >= 0) & (d < 5) & ((kp[None, :] < 3) | (kp[None, :] <= qp[:, None]))
    keep = keep[None, None] & (ids[:, None, qp, None] == ids[:, None, None, kp])
    check(masked, (q, k, v, ids), plain.finish(plain.scores(q, k), v, keep))
    text = masked.ir()
    assert "attn.mask %s sliding_window(5)" in text
    assert "attn.mask %s_1 prefix_lm(3)" in text
    assert "attn.mask %s_2 document(%ids : tensor<?x?xi32>)" in text


def test_causal_and_a_fully_masked_row_gives_zeros():
    @af.variant
    def none_kept(q, k, v):
        s = af.mask(af.qk(q, k), af.causal)
        return af.pv(af.softmax(af.mask(s, lambda b, h, qi, kv: qi < 15)), v)

    q, k, v = qkv(nq=8, nk=20)
    out = check(none_kept, (q, k, v), None)
    assert torch.all(out[:, :, 3:] == 0) and torch.all(out[:, :, :3].abs().sum(-1) > 0)


def test_alibi_bias_softcap_and_post_scale():
    @af.variant
    def biased(q, k, v, slopes):
        s = af.scale(af.qk(q, k), 0.5)
        s = af.softcap(af.bias(s, af.alibi(slopes)), 2.0)
        return af.pv(af.softmax(af.mask(s, af.causal)), v)

    q, k, v = qkv()
    slopes = af.alibi_slopes(4)
    qp, kp = plain.positions(q.shape[2], k.shape[2])
    s = plain.scores(q, k) * 0.5 + slopes.double()[None, :, None, None] * (kp[None, :] - qp[:, None])
    s = 2.0 * torch.tanh(s / 2.0)
    check(biased, (q, k, v, slopes), plain.finish(s, v, kp[None, :] <= qp[:, None]))
    text = biased.ir()
    assert "attn.scale %s value = 0.5 : !attn.scores<4>" in text
    assert "attn.bias %s_1 alibi(%slopes : tensor<4xf32>)" in text
    assert "attn.softcap %s_2 cap = 2.0" in text


def test_softmax_sink():
    @af.variant
    def sunk(q, k, v, sink):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.sliding_window(4)), sink=sink), v)

    q, k, v = qkv()
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0])
    qp, kp = plain.positions(q.shape[2], k.shape[2])
    d = qp[:, None] - kp[None, :]
    check(sunk, (q, k, v, sink), plain.finish(plain.scores(q, k), v, (d >= 0) & (d < 4), sink))
    assert "attn.softmax %s_1 sink(%sink : tensor<4xf32>)" in sunk.ir()


# --------------------------------------------------------------------------- custom functions


def _custom_bias_variant(fn):
    @af.variant
    def custom(q, k, v):
        return af.pv(af.softmax(af.bias(af.qk(q, k), fn)), v)

    return custom


@pytest.mark.parametrize(
    "fn",
    [
        lambda b, h, qi, kv: (qi - kv - 7) // 3,
        lambda b, h, qi, kv: (kv - qi) % 4,
        lambda b, h, qi, kv: -((kv - qi) // -3),
        lambda b, h, qi, kv: (kv - qi + 2) % -3,
        lambda b, h, qi, kv: 19 % (kv - qi - 40),
    ],
    ids=["floordiv", "mod", "floordiv-negative-divisor", "mod-negative-divisor", "constant-dividend"],
)
def test_integer_division_rounds_toward_minus_infinity(fn):
    """`//` and `%` on traced ints follow Python (torch's `//` and `%` on int tensors do too)."""
    q, k, v = qkv(nq=11, nk=17)
    b, h, qp, kp = plain.index_grids(2, 4, 11, 17)
    bias = fn(b, h, qp, kp).to(F64)
    assert (qp - kp).min() < 0 < (qp - kp).max()  # operands of both signs are exercised
    check(_custom_bias_variant(fn), (q, k, v), plain.finish(plain.scores(q, k) + bias, v))
    assert -7 // 2 == -4 and -7 % 2 == 1  # the semantics the module docstring promises


def test_int_float_promotion_where_and_math_functions():
    def fn(b, h, qi, kv):
        d = qi - kv  # int
        ratio = d / 4  # float (Python's true division)
        return af.where(d > 2, af.exp(-ratio) + af.tanh(ratio), af.sqrt(af.abs(d) + 1) * 0.5) + h

    def ref(b, h, qi, kv):
        d = (qi - kv).to(F64)
        return torch.where(d > 2, torch.exp(-d / 4) + torch.tanh(d / 4), torch.sqrt(d.abs() + 1) * 0.5) + h

    q, k, v = qkv()
    grids = plain.index_grids(2, 4, q.shape[2], k.shape[2])
    custom = _custom_bias_variant(fn)
    check(custom, (q, k, v), plain.finish(plain.scores(q, k) + ref(*grids), v))
    text = custom.ir()
    for op in ("arith.sitofp", "arith.divf", "arith.select", "math.exp", "math.tanh", "math.sqrt", "math.absi"):
        assert op in text
    assert "arith.constant 4.000000e+00 : f32" in text  # a float constant, not a converted int


def test_score_mod_and_bool_logic():
    def mod(score, b, h, qi, kv):
        return af.where((kv % 2 == 0) & ~(qi == kv) | (h == 1), score * 2.0, score - 1)

    @af.variant
    def modded(q, k, v):
        return af.pv(af.softmax(af.score_mod(af.qk(q, k), mod)), v)

    q, k, v = qkv()
    s = plain.scores(q, k)
    b, h, qp, kp = plain.index_grids(2, 4, q.shape[2], k.shape[2])
    cond = (kp % 2 == 0) & ~(qp == kp) | (h == 1)
    check(modded, (q, k, v), plain.finish(torch.where(cond, s * 2.0, s - 1), v))
    text = modded.ir()
    assert "^bb0(%score: f32, %b: i32, %h: i32, %q_idx: i32, %kv_idx: i32)" in text
    assert "arith.andi" in text and "arith.ori" in text and "arith.xori" in text


def test_custom_mask_indexing_extra_tensors():
    @af.variant
    def doc_custom(q, k, v, ids, allowed):
        s = af.mask(af.qk(q, k), lambda b, h, qi, kv: (ids[b, qi] == ids[b, kv]) & af.causal(b, h, qi, kv))
        s = af.mask(s, lambda b, h, qi, kv: allowed[h, kv % 4])
        return af.pv(af.softmax(s), v)

    q, k, v = qkv(nq=10, nk=16)
    ids = torch.tensor([[0] * 5 + [1] * 11, [0] * 12 + [3] * 4], dtype=torch.int64)
    allowed = torch.rand(4, 4, generator=torch.Generator().manual_seed(3)) > 0.3
    b, h, qp, kp = plain.index_grids(2, 4, 10, 16)
    keep = (ids[b, qp] == ids[b, kp]) & (kp <= qp) & allowed[h, kp % 4]
    check(doc_custom, (q, k, v, ids, allowed), plain.finish(plain.scores(q, k), v, keep))
    text = doc_custom.ir()
    assert "attn.mask %s custom(%ids : tensor<?x?xi64>)" in text
    assert "attn.extract %ids_1[%b, %q_idx] : tensor<?x?xi64>" in text
    assert "arith.trunci" in text  # int64 elements are narrowed to i32
    assert "custom(%allowed : tensor<?x?xi1>)" in text


def test_predicate_combinators():
    @af.variant
    def combined(q, k, v):
        either = af.sliding_window(3) | af.prefix_lm(2)
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal & ~af.sliding_window(2) | either)), v)

    q, k, v = qkv()
    qp, kp = plain.positions(q.shape[2], k.shape[2])
    d = qp[:, None] - kp[None, :]
    window = lambda w: (d >= 0) & (d < w)  # noqa: E731
    keep = ((kp[None, :] <= qp[:, None]) & ~window(2)) | window(3) | (kp[None, :] < 2) | (kp[None, :] <= qp[:, None])
    check(combined, (q, k, v), plain.finish(plain.scores(q, k), v, keep))
    assert "attn.mask %s custom" in combined.ir()


def test_conjunction_of_named_masks_stays_named():
    @af.variant
    def both(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal & af.sliding_window(8))), v)

    text = both.ir()
    assert "attn.mask %s causal" in text and "attn.mask %s_1 sliding_window(8)" in text
    assert "custom" not in text


def test_masks_applied_twice_both_hold():
    @af.variant
    def twice(q, k, v):
        s = af.mask(af.qk(q, k), af.causal)
        s = af.mask(s, lambda b, h, qi, kv: kv % 3 != 0)
        return af.pv(af.softmax(s), v)

    q, k, v = qkv()
    qp, kp = plain.positions(q.shape[2], k.shape[2])
    keep = (kp[None, :] <= qp[:, None]) & (kp[None, :] % 3 != 0)
    check(twice, (q, k, v), plain.finish(plain.scores(q, k), v, keep))


def test_constant_arguments_are_traced_in():
    @af.variant
    def windowed(q, k, v, window=4):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.sliding_window(window))), v)

    q, k, v = qkv()
    assert "sliding_window(4)" in windowed.ir(q, k, v)
    assert "sliding_window(9)" in windowed.ir(q, k, v, 9)
    qp, kp = plain.positions(q.shape[2], k.shape[2])
    d = qp[:, None] - kp[None, :]
    check(windowed, (q, k, v, 9), plain.finish(plain.scores(q, k), v, (d >= 0) & (d < 9)))


def test_unused_blocks_are_dropped_from_the_ir():
    @af.variant
    def wasteful(q, k, v):
        af.rope(q)
        af.qk_norm(k)
        return af.pv(af.softmax(af.qk(q, k)), v)

    text = wasteful.ir()
    assert "attn.rope" not in text and "attn.norm" not in text


# --------------------------------------------------------------------------- tracing once per signature


def test_trace_once_per_signature():
    @af.variant
    def counted(q, k, v):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    before = af.runtime.stats()["traces"]
    with af.backend("reference"):
        counted(*qkv(nq=5, nk=9))
        counted(*qkv(nq=7, nk=33, b=3))  # new lengths and batch: same IR
        assert af.runtime.stats()["traces"] == before + 1
        counted(*qkv(nq=5, nk=9, hq=2))  # new head count: new IR
        counted(*qkv(nq=5, nk=9, dtype=torch.float16))  # new dtype: new IR
    assert af.runtime.stats()["traces"] == before + 3


# --------------------------------------------------------------------------- random compositions
#
# Hypothesis draws random block compositions, derandomized (the same examples on every
# run, as in test_lowering_random.py), so that CI is reproducible and its time bounded.

# Custom functions as (traced form, plain form); most expressions mean the same on
# traced scalars and on int64 torch tensors.
MASK_FNS = [
    (lambda b, h, qi, kv: (qi - kv) % 3 != 1,) * 2,
    (lambda b, h, qi, kv: (kv // 4) <= (qi // 4),) * 2,
    (lambda b, h, qi, kv: ~((qi - kv) > 5) | (h == 0),) * 2,
]
BIAS_FNS = [
    (lambda b, h, qi, kv: (kv - qi) / 4,) * 2,
    (lambda b, h, qi, kv: (b + 1) * (h - 1) * 0.25,) * 2,
]
SCORE_MODS = [
    (lambda s, b, h, qi, kv: s * 0.5 + kv % 2,) * 2,
    (lambda s, b, h, qi, kv: af.tanh(s) * 3.0, lambda s, b, h, qi, kv: torch.tanh(s) * 3.0),
]


@st.composite
def compositions(draw):
    hkv = draw(st.sampled_from([1, 2]))
    shape = dict(
        b=draw(st.integers(1, 2)),
        hkv=hkv,
        hq=hkv * draw(st.sampled_from([1, 2, 3])),
        nk=draw(st.integers(1, 40)),
        d=draw(st.sampled_from([8, 16, 24])),
        dv=draw(st.sampled_from([8, 16])),
    )
    shape["nq"] = draw(st.integers(1, shape["nk"]))
    rotary = st.sampled_from([None, 4, shape["d"]])
    pre = st.one_of(
        st.tuples(st.just("rope"), st.sampled_from(["half", "interleaved"]), rotary),
        st.tuples(st.just("norm"), st.booleans()),
        st.tuples(st.just("scale"), st.sampled_from([0.5, 1.5])),
    )
    post = st.one_of(
        st.tuples(st.just("scale"), st.sampled_from([0.5, 2.0])),
        st.tuples(st.just("mask"), st.sampled_from(["causal", "window", "prefix"])),
        st.tuples(st.just("custom_mask"), st.integers(0, len(MASK_FNS) - 1)),
        st.tuples(st.just("alibi")),
        st.tuples(st.just("custom_bias"), st.integers(0, len(BIAS_FNS) - 1)),
        st.tuples(st.just("softcap"), st.sampled_from([5.0, 20.0])),
        st.tuples(st.just("score_mod"), st.integers(0, len(SCORE_MODS) - 1)),
    )
    return dict(
        shape=shape,
        q_pre=draw(st.lists(pre, max_size=2)),
        k_pre=draw(st.lists(pre, max_size=2)),
        post=draw(st.lists(post, max_size=4)),
        sink=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])),
        strided=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )


def build(plan):
    """The traced variant for `plan` and a plain float64 evaluation of it."""

    def pre_traced(x, ops, w):
        for op in ops:
            if op[0] == "rope":
                x = af.rope(x, theta=1000.0, style=op[1], rotary_dim=op[2])
            elif op[0] == "norm":
                x = af.qk_norm(x, w if op[1] else None)
            else:
                x = af.scale(x, op[1])
        return x

    def fn(q, k, v, slopes, sink, qw, kw):
        s = af.qk(pre_traced(q, plan["q_pre"], qw), pre_traced(k, plan["k_pre"], kw))
        for op in plan["post"]:
            if op[0] == "scale":
                s = af.scale(s, op[1])
            elif op[0] == "mask":
                s = af.mask(s, {"causal": af.causal, "window": af.sliding_window(6), "prefix": af.prefix_lm(4)}[op[1]])
            elif op[0] == "custom_mask":
                s = af.mask(s, MASK_FNS[op[1]][0])
            elif op[0] == "alibi":
                s = af.bias(s, af.alibi(slopes))
            elif op[0] == "custom_bias":
                s = af.bias(s, BIAS_FNS[op[1]][0])
            elif op[0] == "softcap":
                s = af.softcap(s, op[1])
            else:
                s = af.score_mod(s, SCORE_MODS[op[1]][0])
        return af.pv(af.softmax(s, sink=sink if plan["sink"] else None), v)

    def evaluate(q, k, v, slopes, sink, qw, kw):
        nq, nk = q.shape[2], k.shape[2]
        qp, kp = plain.positions(nq, nk)

        def pre_plain(x, ops, w, pos):
            x = x.to(F64)
            for op in ops:
                if op[0] == "rope":
                    x = plain.rope(x, pos, plain.default_inv_freq(1000.0, op[2] or x.shape[-1]), op[1])
                elif op[0] == "norm":
                    x = plain.rms_norm(x, w if op[1] else None)
                else:
                    x = x * op[1]
            return x

        s = plain.scores(pre_plain(q, plan["q_pre"], qw, qp), pre_plain(k, plan["k_pre"], kw, kp))
        grids = plain.index_grids(q.shape[0], q.shape[1], nq, nk)
        b, h, qi, kv = grids
        keep = torch.ones_like(s, dtype=torch.bool)
        for op in plan["post"]:
            if op[0] == "scale":
                s = s * op[1]
            elif op[0] == "mask":
                d = qi - kv
                keep = keep & {"causal": d >= 0, "window": (d >= 0) & (d < 6), "prefix": (kv < 4) | (d >= 0)}[op[1]]
            elif op[0] == "custom_mask":
                keep = keep & MASK_FNS[op[1]][1](*grids)
            elif op[0] == "alibi":
                s = s + slopes.to(F64)[h] * (kv - qi)
            elif op[0] == "custom_bias":
                s = s + BIAS_FNS[op[1]][1](*grids)
            elif op[0] == "softcap":
                s = op[1] * torch.tanh(s / op[1])
            else:
                s = SCORE_MODS[op[1]][1](s, *grids)
        return plain.finish(s, v, keep, sink if plan["sink"] else None)

    return af.variant(fn), evaluate


def make_inputs(plan):
    sh, dtype, seed = plan["shape"], plan["dtype"], plan["seed"]
    b, hq, hkv, nq, nk, d, dv = (sh[n] for n in ("b", "hq", "hkv", "nq", "nk", "d", "dv"))
    if plan["strided"]:  # [B, N, H, D] storage seen as [B, H, N, D]: non-contiguous views
        q = rand(b, nq, hq, d, dtype=dtype, seed=seed).transpose(1, 2)
        k = rand(b, nk, hkv, d, dtype=dtype, seed=seed + 1).transpose(1, 2)
        v = rand(b, nk, hkv, dv, dtype=dtype, seed=seed + 2).transpose(1, 2)
    else:
        q = rand(b, hq, nq, d, dtype=dtype, seed=seed)
        k = rand(b, hkv, nk, d, dtype=dtype, seed=seed + 1)
        v = rand(b, hkv, nk, dv, dtype=dtype, seed=seed + 2)
    g = torch.Generator().manual_seed(seed + 3)
    slopes = af.alibi_slopes(hq)
    sink = torch.randn(hq, generator=g)
    qw, kw = torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5
    return q, k, v, slopes, sink, qw, kw


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(compositions())
def test_random_compositions_match_reference_and_formula(plan):
    variant, evaluate = build(plan)
    args = make_inputs(plan)
    with af.backend("reference"):
        out = variant(*args)
    oracle = run_reference(variant.ir_module(*args), *args)
    expected = evaluate(*args)
    torch.testing.assert_close(oracle, expected, atol=1e-8, rtol=1e-8)
    atol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}[plan["dtype"]]
    torch.testing.assert_close(out.to(F64), oracle, atol=atol, rtol=atol)
    assert math.isfinite(out.double().abs().max().item())
