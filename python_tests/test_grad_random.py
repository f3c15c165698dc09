"""Random compositions of the building blocks, differentiated (hypothesis, derandomized:
the same examples on every run, so CI stays reproducible and its time bounded).

Each example draws the shapes (batch, GQA, head dims 16/24/32, Dv, Nq <= Nk <= 48), the
dtype, the pre-matmul chains of q and k (QK-norm with or without a weight, RoPE of either
style, partial or not, with or without a scaling scheme, a scale), an optional qk scale, a
score chain in random order (scale, softcap, ALiBi, a custom bias, two score_mods, causal,
sliding window, prefix-LM, document mask), an optional learned sink, and which of q, k, v,
the norm weights and the sink require grad. The variant is built with the DSL; its float64
formula is built from the same draw with `plain_attention.py`, and `test_grad.compute` and
`check` compare the backend's gradients with it and with the reference executor.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import plain_attention as plain
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grad import F64, Shape, check, compute

import attnfuse as af

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")

REFERENCE_EXAMPLES = 80
"""Examples on the reference backend: tens of milliseconds each."""
INTERPRET_EXAMPLES = 20
"""Examples under the interpreter, whose forward and backward kernels take seconds per example."""

# rope scaling: (the DSL's scaling= argument, the plain formula's (inv_freq, magnitude) of (theta, rotary_dim))
SCALINGS = {
    "none": (None, lambda theta, r: (plain.default_inv_freq(theta, r), 1.0)),
    "linear": (af.linear_scaling(2.0), lambda theta, r: (plain.linear_inv_freq(theta, r, 2.0), 1.0)),
    "llama3": (
        {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 64},
        lambda theta, r: (plain.llama3_inv_freq(theta, r, 4.0, original=64.0), 1.0),
    ),
    "yarn": (af.yarn_scaling(8.0, 16), lambda theta, r: plain.yarn_inv_freq(theta, r, 8.0, 16.0)),
}


@dataclass
class Spec:
    """One drawn composition: see the module docstring."""

    dtype: torch.dtype
    shape: Shape
    q_ops: list[tuple] = field(default_factory=list)
    k_ops: list[tuple] = field(default_factory=list)
    qk_scale: float | None = None
    score_ops: list[tuple] = field(default_factory=list)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    sink: bool = False
    wants: set[str] = field(default_factory=set)
    seed: int = 0


# --------------------------------------------------------------------------- the DSL side


def _dsl_pre(x, ops: list[tuple], env: dict):
    for op in ops:
        if op[0] == "norm":
            x = af.qk_norm(x, None if op[1] is None else env[op[1]], eps=op[2])
        elif op[0] == "rope":
            _, style, rdim, scaling, theta = op
            x = af.rope(x, theta=theta, style=style, rotary_dim=rdim, scaling=SCALINGS[scaling][0])
        else:
            x = af.scale(x, op[1])
    return x


def _dsl_score(s, op: tuple, env: dict):
    kind = op[0]
    if kind == "scale":
        return af.scale(s, op[1])
    if kind == "softcap":
        return af.softcap(s, op[1])
    if kind == "alibi":
        return af.bias(s, af.alibi(env["slopes"]))
    if kind == "bias_fn":
        return af.bias(s, lambda b, h, qi, kv: (kv - qi) * 0.0625 - h * 0.25)
    if kind == "square":
        return af.score_mod(s, lambda x, b, h, qi, kv: x * x * 0.25 + x)
    if kind == "tanh":
        return af.score_mod(s, lambda x, b, h, qi, kv: af.tanh(x * 0.5) * 2.0 + x * 0.5)
    if kind == "causal":
        return af.mask(s, af.causal)
    if kind == "window":
        return af.mask(s, af.sliding_window(op[1]))
    if kind == "prefix":
        return af.mask(s, af.prefix_lm(op[1]))
    assert kind == "document"
    return af.mask(s, af.document(env["ids"]))


def build_variant(spec: Spec) -> af.Variant:
    names = ["q", "k", "v", *spec.extras]

    def composed(*args):
        env = dict(zip(names, args, strict=True))
        q, k = _dsl_pre(env["q"], spec.q_ops, env), _dsl_pre(env["k"], spec.k_ops, env)
        s = af.qk(q, k, scale=spec.qk_scale)
        for op in spec.score_ops:
            s = _dsl_score(s, op, env)
        return af.pv(af.softmax(s, sink=env["sink"] if spec.sink else None), env["v"])

    composed.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    )
    return af.variant(composed)


# --------------------------------------------------------------------------- the plain float64 side


def _plain_pre(x, ops: list[tuple], env: dict, pos: torch.Tensor):
    for op in ops:
        if op[0] == "norm":
            x = plain.rms_norm(x, None if op[1] is None else env[op[1]], op[2])
        elif op[0] == "rope":
            _, style, rdim, scaling, theta = op
            inv, magnitude = SCALINGS[scaling][1](theta, rdim)
            x = plain.rope(x, pos, inv, style, magnitude)
        else:
            x = op[1] * x.to(F64)
    return x


def _plain_score(s, keep, op: tuple, env: dict, nq: int, nk: int):
    """(scores, keep) after `op`: masks narrow `keep`, the other ops change the scores."""
    kind = op[0]
    _, h, qp, kp = plain.index_grids(1, s.shape[1], nq, nk)
    if kind == "scale":
        s = op[1] * s
    elif kind == "softcap":
        s = plain.softcap(s, op[1])
    elif kind == "alibi":
        s = s + plain.alibi_bias(env["slopes"], nq, nk)
    elif kind == "bias_fn":
        s = s + ((kp - qp) * 0.0625 - h * 0.25).to(F64)
    elif kind == "square":
        s = s * s * 0.25 + s
    elif kind == "tanh":
        s = torch.tanh(s * 0.5) * 2.0 + s * 0.5
    elif kind == "causal":
        keep = keep & plain.causal_keep(nq, nk)
    elif kind == "window":
        keep = keep & plain.sliding_window_keep(nq, nk, op[1])
    elif kind == "prefix":
        keep = keep & plain.prefix_lm_keep(nq, nk, op[1])
    else:
        keep = keep & plain.document_keep(env["ids"], nq)
    return s, keep


def build_formula(spec: Spec):
    names = ["q", "k", "v", *spec.extras]

    def formula(*args):
        env = dict(zip(names, args, strict=True))
        nq, nk = env["q"].shape[2], env["k"].shape[2]
        qp, kp = plain.positions(nq, nk)
        q, k = _plain_pre(env["q"], spec.q_ops, env, qp), _plain_pre(env["k"], spec.k_ops, env, kp)
        s, keep = plain.scores(q, k, spec.qk_scale), torch.ones(nq, nk, dtype=torch.bool)
        for op in spec.score_ops:
            s, keep = _plain_score(s, keep, op, env, nq, nk)
        return plain.finish(s, env["v"], keep, env["sink"] if spec.sink else None)

    return formula


# --------------------------------------------------------------------------- the strategy


@st.composite
def shapes(draw) -> Shape:
    hkv = draw(st.sampled_from([1, 2]))
    hq = hkv * draw(st.sampled_from([1, 2])) if hkv == 2 else draw(st.sampled_from([1, 2, 3, 4]))
    d = draw(st.sampled_from([16, 24, 32]))
    dv = draw(st.sampled_from([d, 16]))
    nk = draw(st.integers(1, 48))
    nq = draw(st.integers(1, nk))
    return Shape(draw(st.integers(1, 2)), hq, hkv, nq, nk, d, dv)


def _draw_pre(draw, spec: Spec, side: str, rope: tuple | None, gen: torch.Generator) -> list[tuple]:
    ops: list[tuple] = []
    if draw(st.booleans()):
        weight = None
        if draw(st.booleans()):
            weight = f"{side}w"
            spec.extras[weight] = torch.rand(spec.shape.d, generator=gen) + 0.5
        ops.append(("norm", weight, draw(st.sampled_from([1e-6, 1e-5]))))
    if rope is not None and (side == "k" or draw(st.booleans())):
        ops.append(rope)
    if draw(st.booleans()):
        ops.append(("scale", draw(st.sampled_from([0.5, 1.5, -1.0]))))
    return ops


SCORE_BLOCKS = ["scale", "softcap", "alibi", "bias_fn", "square", "tanh", "causal", "window", "prefix", "document"]


def _draw_score_ops(draw, spec: Spec, gen: torch.Generator) -> list[tuple]:
    b, hq, _, _, nk, _, _ = spec.shape
    ops: list[tuple] = []
    for kind in draw(st.permutations(draw(st.lists(st.sampled_from(SCORE_BLOCKS), unique=True, max_size=4)))):
        if kind == "scale":
            ops.append((kind, draw(st.sampled_from([1.25, 0.5]))))
        elif kind == "softcap":
            ops.append((kind, draw(st.sampled_from([2.0, 4.0]))))
        elif kind == "window":
            ops.append((kind, draw(st.integers(1, 40))))
        elif kind == "prefix":
            ops.append((kind, draw(st.integers(0, 40))))
        else:
            ops.append((kind,))
            if kind == "alibi":
                spec.extras["slopes"] = torch.rand(hq, generator=gen) * 0.5
            elif kind == "document":
                spec.extras["ids"] = (torch.rand(b, nk, generator=gen) < 0.15).cumsum(1).to(torch.int32)
    return ops


@st.composite
def specs(draw) -> Spec:
    spec = Spec(dtype=draw(st.sampled_from([torch.float16, torch.float32])), shape=draw(shapes()))
    spec.seed = draw(st.integers(0, 999))
    gen = torch.Generator().manual_seed(spec.seed + 1000)
    d = spec.shape.d
    rope = None
    if draw(st.booleans()):
        rope = (
            "rope",
            draw(st.sampled_from(["half", "interleaved"])),
            draw(st.sampled_from([d, d // 2])),
            draw(st.sampled_from(list(SCALINGS))),
            draw(st.sampled_from([10000.0, 500.0])),
        )
    spec.q_ops = _draw_pre(draw, spec, "q", rope, gen)
    spec.k_ops = _draw_pre(draw, spec, "k", rope, gen)
    spec.qk_scale = draw(st.sampled_from([None, 0.2]))
    spec.score_ops = _draw_score_ops(draw, spec, gen)
    if draw(st.booleans()):
        spec.sink = True
        spec.extras["sink"] = torch.randn(spec.shape.hq, generator=gen)
    differentiable = ["q", "k", "v", *(n for n in ("qw", "kw", "sink") if n in spec.extras)]
    spec.wants = set(draw(st.lists(st.sampled_from(differentiable), unique=True, min_size=1)))
    return spec


def spec_args(spec: Spec) -> tuple:
    gen = torch.Generator().manual_seed(spec.seed)
    b, hq, hkv, nq, nk, d, dv = spec.shape
    q = torch.randn(b, hq, nq, d, generator=gen).to(spec.dtype)
    k = torch.randn(b, hkv, nk, d, generator=gen).to(spec.dtype)
    v = torch.randn(b, hkv, nk, dv, generator=gen).to(spec.dtype)
    return (q, k, v, *spec.extras.values())


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """A private kernel cache folder for this module's interpreted kernels."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("grad-random-cache")))
        yield


def _check(backend: str, spec: Spec) -> None:
    result = compute(build_variant(spec), build_formula(spec), spec_args(spec), spec.wants, backend)
    check(result, spec.wants, spec.dtype, f"{describe(spec)} on {backend}")


def describe(spec: Spec) -> str:
    """The draw in one line, extra tensors by name only."""
    return (
        f"{spec.dtype} {tuple(spec.shape)} (b, hq, hkv, nq, nk, d, dv) q {spec.q_ops} k {spec.k_ops} "
        f"qk scale {spec.qk_scale} scores {spec.score_ops} sink {spec.sink} extras {list(spec.extras)} "
        f"requiring grad {sorted(spec.wants)} seed {spec.seed}"
    )


_SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow]}


@settings(max_examples=REFERENCE_EXAMPLES, **_SETTINGS)
@given(spec=specs())
def test_random_composition_gradients_reference(spec):
    _check("reference", spec)


@settings(max_examples=INTERPRET_EXAMPLES, **_SETTINGS)
@given(spec=specs())
def test_random_composition_gradients_interpret(spec):
    _check("interpret", spec)
