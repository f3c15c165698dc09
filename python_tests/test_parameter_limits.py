"""The limits of the DSL's numeric parameters (issue 10 item 5).

Every numeric parameter has an accepted range, checked when the variant is traced:
a value outside it (NaN, an infinity, zero or a negative number where they mean
nothing, an integer too large for the kernels' i32 positions or a float too large for
their f32 arithmetic, a bool where an integer is asked for) gets an `AttnFuseError`
naming the function, the argument, the value and the range. Nothing outside the range
reaches a backend, so backends cannot disagree on it; at the edge of the range they
agree: the largest window, 2**31 - 1, is plain causal attention on every backend.
"""

from __future__ import annotations

import math

import numpy as np
import plain_attention as plain
import pytest
import torch

import attnfuse as af

F32_MAX = "3.402823e\\+38"
I32_MAX = 2**31 - 1


def traced_scores(body, *extras):
    """Trace a variant whose scores are `body(s, *extras)`."""

    def fn(q, k, v, *rest):
        return af.pv(af.softmax(body(af.qk(q, k), *rest)), v)

    names = ["q", "k", "v", *[f"x{i}" for i in range(len(extras))]]
    src = f"lambda {', '.join(names)}: fn({', '.join(names)})"
    q = torch.zeros(1, 2, 4, 16)
    return af.variant(eval(src, {"fn": fn}), name="scores").ir(q, q, q, *extras)


def traced_q(transform):
    """Trace a variant that applies `transform` to q."""
    q = torch.zeros(1, 2, 4, 16)
    return af.variant(lambda q, k, v: af.pv(af.softmax(af.qk(transform(q), k)), v), name="pre").ir(q, q, q)


def traced_qk(scale):
    """Trace a variant whose scores are af.qk(q, k, scale)."""
    q = torch.zeros(1, 2, 4, 16)
    return af.variant(lambda q, k, v: af.pv(af.softmax(af.qk(q, k, scale)), v), name="qk").ir(q, q, q)


def yarn(**params):
    return af.yarn_scaling(**{"factor": 4.0, "original_max_position": 4096, **params})


# (what, the call, the expected message): each message names the function and the
# argument, the accepted range and the value given.
REJECTED = [
    *[
        (
            f"sliding_window({value!r})",
            lambda v=value: traced_scores(lambda s: af.mask(s, af.sliding_window(v))),
            rf"af.sliding_window\(w\) must be an integer in \[1, 2147483647\] \(at most 2\*\*31 - 1: kernels "
            rf"compute positions in i32\), got {shown}",
        )
        for value, shown in [
            (2**31, "2147483648"),
            (2**40, "1099511627776"),
            (2**63, "9223372036854775808"),
            (2**100, "an integer of 101 bits"),
            (0, "0"),
            (-1, "-1"),
            (True, r"True \(a bool\)"),
            (4.0, "4.0"),
            ("4", r"'4' \(a str\)"),
        ]
    ],
    *[
        (
            f"prefix_lm({value!r})",
            lambda v=value: traced_scores(lambda s: af.mask(s, af.prefix_lm(v))),
            rf"af.prefix_lm\(n\) must be an integer in \[0, 2147483647\] .*, got {shown}",
        )
        for value, shown in [(2**31, "2147483648"), (2**40, "1099511627776"), (-1, "-1"), (False, r"False \(a bool\)")]
    ],
    (
        "document(bool ids)",
        lambda: traced_scores(lambda s, ids: af.mask(s, af.document(ids)), torch.zeros(1, 4, dtype=torch.bool)),
        r"af.document ids \(x0\) must be an integer tensor \[B, Nk\] \(torch.int32 or torch.int64\), "
        r"got a 2-d torch.bool tensor",
    ),
    (
        "document(float ids)",
        lambda: traced_scores(lambda s, ids: af.mask(s, af.document(ids)), torch.zeros(1, 4, dtype=torch.float16)),
        r"af.document ids \(x0\) must be an integer tensor .*got a 2-d torch.float16 tensor",
    ),
    *[
        (
            f"rope theta={value!r}",
            lambda v=value: traced_q(lambda q: af.rope(q, theta=v)),
            rf"af.rope theta must be a number in \(0, {F32_MAX}\] \(finite in f32, in which kernels compute\), "
            rf"got {shown}",
        )
        for value, shown in [
            (math.nan, "nan"),
            (math.inf, "inf"),
            (0.0, "0.0"),
            (-10000.0, "-10000.0"),
            (1e300, r"1e\+300"),
            (10**400, "an integer of 1329 bits"),
            (True, r"True \(a bool\)"),
        ]
    ],
    (
        "rope theta=1 with yarn",
        lambda: traced_q(lambda q: af.rope(q, theta=1.0, scaling=yarn())),
        r"af.rope theta must be > 1 with yarn scaling \(YaRN's correction range divides by ln\(theta\)\), got 1.0",
    ),
    *[
        (
            f"rope rotary_dim={value!r}",
            lambda v=value: traced_q(lambda q: af.rope(q, rotary_dim=v)),
            rf"af.rope rotary_dim must be an even integer in \[2, 16\] \(q's head dim\), got {shown}",
        )
        for value, shown in [
            (0, "0"),
            (-2, "-2"),
            (7, "7"),
            (18, "18"),
            (2**40, "1099511627776"),
            (2**70, "an integer of 71 bits"),
            (True, r"True \(a bool\)"),
            (8.0, "8.0"),
        ]
    ],
    *[
        (
            f"qk_norm eps={value!r}",
            lambda v=value: traced_q(lambda q: af.qk_norm(q, eps=v)),
            rf"af.qk_norm eps must be a number in \(0, {F32_MAX}\] .*, got {shown}",
        )
        for value, shown in [(math.nan, "nan"), (math.inf, "inf"), (0.0, "0.0"), (-1e-6, "-1e-06"), (1e39, r"1e\+39")]
    ],
    *[
        (
            f"scale c={value!r} ({where})",
            lambda v=value, w=where: (
                traced_q(lambda q: af.scale(q, v)) if w == "q" else traced_scores(lambda s: af.scale(s, v))
            ),
            rf"af.scale c must be a number in \[-{F32_MAX}, {F32_MAX}\] .*, got {shown}",
        )
        for where in ("q", "scores")
        for value, shown in [
            (math.nan, "nan"),
            (-math.inf, "-inf"),
            (-1e300, r"-1e\+300"),
            (10**400, "an integer of 1329 bits"),
        ]
    ],
    *[
        (
            f"qk scale={value!r}",
            lambda v=value: traced_qk(v),
            rf"af.qk scale must be a number in \(0, {F32_MAX}\] .*, got {shown}",
        )
        for value, shown in [(math.nan, "nan"), (math.inf, "inf"), (0.0, "0.0"), (-0.125, "-0.125"), (1e39, r"1e\+39")]
    ],
    *[
        (
            f"softcap cap={value!r}",
            lambda v=value: traced_scores(lambda s: af.softcap(s, v)),
            rf"af.softcap cap must be a number in \(0, {F32_MAX}\] .*, got {shown}",
        )
        for value, shown in [
            (math.nan, "nan"),
            (math.inf, "inf"),
            (0.0, "0.0"),
            (-30.0, "-30.0"),
            (10**400, "an integer of 1329 bits"),
        ]
    ],
    *[
        (
            f"{name}",
            call,
            rf"{kind} rope scaling parameter {param} must be a number in {low}, {F32_MAX}\] .*, got {shown}",
        )
        for name, call, kind, param, low, shown in [
            ("linear factor nan", lambda: af.linear_scaling(math.nan), "linear", "factor", r"\(0", "nan"),
            ("linear factor 0", lambda: af.linear_scaling(0), "linear", "factor", r"\(0", "0"),
            (
                "linear factor huge",
                lambda: af.linear_scaling(10**400),
                "linear",
                "factor",
                r"\(0",
                "an integer of 1329",
            ),
            ("llama3 factor inf", lambda: af.llama3_scaling(factor=math.inf), "llama3", "factor", r"\(0", "inf"),
            (
                "llama3 original_max_position inf",
                lambda: af.llama3_scaling(original_max_position=math.inf),
                "llama3",
                "original_max_position",
                r"\(0",
                "inf",
            ),
            ("yarn factor nan", lambda: yarn(factor=math.nan), "yarn", "factor", r"\(0", "nan"),
            ("yarn beta_fast inf", lambda: yarn(beta_fast=math.inf), "yarn", "beta_fast", r"\(0", "inf"),
            ("yarn beta_slow 0", lambda: yarn(beta_slow=0.0), "yarn", "beta_slow", r"\(0", "0.0"),
            (
                "yarn attention_factor -1",
                lambda: yarn(attention_factor=-1.0),
                "yarn",
                "attention_factor",
                r"\[0",
                "-1.0",
            ),
            (
                "hf dict original_max_position nan",
                lambda: af.rope_scaling(
                    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": math.nan}
                ),
                "yarn",
                "original_max_position",
                r"\(0",
                "nan",
            ),
        ]
    ],
    (
        "float constant in a custom function",
        lambda: traced_scores(lambda s: af.bias(s, lambda b, h, qi, kv: qi * 1e300)),
        rf"float constant 1e\+300 in af.bias function <lambda> does not fit in f32 \(finite values are at most "
        rf"{F32_MAX} in magnitude\)",
    ),
    (
        "huge int in float arithmetic in a custom function",
        lambda: traced_scores(lambda s: af.score_mod(s, lambda x, b, h, qi, kv: x + 10**400)),
        r"float constant an integer of 1329 bits in af.score_mod function <lambda> does not fit in f32",
    ),
    (
        "huge int constant in a custom function",
        lambda: traced_scores(lambda s: af.mask(s, lambda b, h, qi, kv: qi - kv < 2**31)),
        r"integer constant 2147483648 in af.mask predicate <lambda> does not fit in i32",
    ),
]


@pytest.mark.parametrize(("call", "message"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_out_of_range_parameters_are_rejected(call, message):
    with pytest.raises(af.AttnFuseError, match=message):
        call()


def test_values_at_the_edges_are_accepted():
    for w in (1, I32_MAX, np.int64(I32_MAX)):
        assert f"sliding_window({I32_MAX if w != 1 else 1})" in traced_scores(
            lambda s, w=w: af.mask(s, af.sliding_window(w))
        )
    for n in (0, I32_MAX):
        assert f"prefix_lm({n})" in traced_scores(lambda s, n=n: af.mask(s, af.prefix_lm(n)))
    for dtype in (torch.int32, torch.int64):
        ids = torch.zeros(1, 4, dtype=dtype)
        assert "document" in traced_scores(lambda s, ids: af.mask(s, af.document(ids)), ids)
    assert "rotary_dim = 2 " in traced_q(lambda q: af.rope(q, rotary_dim=2))
    assert "theta = 0.5" in traced_q(lambda q: af.rope(q, theta=0.5))  # unusual, but a valid base
    assert "attn.scale %q value = 0.0" in traced_q(lambda q: af.scale(q, 0))  # uniform attention
    assert "attn.scale %s value = -2.0" in traced_scores(lambda s: af.scale(s, -2))
    yarn(attention_factor=0.0)  # 0: YaRN's default
    assert "cap = 3.4028234663852886e+38" in traced_scores(lambda s: af.softcap(s, 3.4028234663852886e38))
    traced_scores(lambda s: af.score_mod(s, lambda x, b, h, qi, kv: af.where(kv > qi, -math.inf, x)))  # -inf fits


# --------------------------------------------------------------------------- the largest window on every backend


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path / "cache"))


@af.variant
def widest_window(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.sliding_window(2**31 - 1))), v)


@af.variant
def causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def widest_prefix(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.prefix_lm(2**31 - 1))), v)


@af.variant
def unmasked(q, k, v):
    return af.pv(af.softmax(af.qk(q, k)), v)


def inputs(nq: int, nk: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(nq * 1000 + nk)
    q = torch.randn(2, 4, nq, 16, generator=g).to(dtype)
    k = torch.randn(2, 2, nk, 16, generator=g).to(dtype)
    v = torch.randn(2, 2, nk, 16, generator=g).to(dtype)
    return q, k, v


SHAPES = [(64, 64), (5, 37), (33, 64), (1, 1)]


@pytest.mark.parametrize("backend", ["reference", "interpret"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(("nq", "nk"), SHAPES, ids=[f"nq{a}-nk{b}" for a, b in SHAPES])
def test_largest_window_is_causal_attention(backend, dtype, nq, nk):
    q, k, v = inputs(nq, nk, dtype)
    qp, kp = plain.positions(nq, nk)
    expected = plain.finish(plain.scores(q, k), v, kp[None, :] <= qp[:, None])
    with af.backend(backend):
        out = widest_window(q, k, v)
        same_backend_causal = causal(q, k, v)
    tol = 1e-5 if dtype == torch.float32 else 4e-3
    torch.testing.assert_close(out, same_backend_causal, atol=tol, rtol=tol)
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_largest_prefix_is_unmasked_attention(backend, dtype):
    q, k, v = inputs(5, 37, dtype)
    expected = plain.finish(plain.scores(q, k), v)
    with af.backend(backend):
        out = widest_prefix(q, k, v)
        same_backend_unmasked = unmasked(q, k, v)
    tol = 1e-5 if dtype == torch.float32 else 4e-3
    torch.testing.assert_close(out, same_backend_unmasked, atol=tol, rtol=tol)
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)
