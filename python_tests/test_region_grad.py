"""Derivatives of score_mod regions (attnfuse.passes.region_grad) against torch.autograd.

Each region, traced from a DSL function or parsed from MLIR, is run by the reference
executor in float64 on random scores; torch.autograd.grad of its value with respect to the
score is compared with the reference's value of the derivative region. Every derivative
region holds only `attn.REGION_OPS` and verifies; ops without a usable derivative are
refused with a message naming them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from xdsl.dialects import arith
from xdsl.dialects.builtin import FloatAttr, ModuleOp, f32, i32
from xdsl.dialects.func import FuncOp
from xdsl.ir import Region
from xdsl.parser import Parser
from xdsl.utils.exceptions import DiagnosticException

import attnfuse as af
from attnfuse.dialects import attn
from attnfuse.ir import get_func, make_context, parse_module
from attnfuse.passes.region_grad import constant_derivative_region, derivative_region, softcap_derivative_region
from attnfuse.reference import _Executor, _Scores

F64 = torch.float64
B, H, NQ, NK, D = 2, 3, 5, 7, 4


def inputs(seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(q, k, v, tab), and random scores [B, H, Nq, Nk]; tab is a float tensor [H, Nk]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, NQ, D, generator=g)
    k, v = (torch.randn(B, H, NK, D, generator=g) for _ in range(2))
    tab = torch.randn(H, NK, generator=g)
    scores = 3 * torch.randn(B, H, NQ, NK, generator=g, dtype=F64)
    return [q, k, v, tab], scores


def traced(make_fn: Callable[[Any], Callable[..., Any]]) -> FuncOp:
    """The function of a variant applying the score_mod `make_fn(tab)` (tab: its extra
    tensor argument, used or not)."""

    @af.variant
    def modded(q, k, v, tab):
        return af.pv(af.softmax(af.score_mod(af.qk(q, k), make_fn(tab))), v)

    return get_func(modded.ir_module(*inputs()[0]))


def score_mod_text(body: str, with_tab: bool = False) -> str:
    """A function whose score_mod region (arguments %x, %b, %h, %qi, %ki[, %t]) is `body`."""
    t = f"tensor<?x{H}x?x{D}xf32>"
    extra = "(%tab : tensor<?x?xf32>)" if with_tab else ""
    arg = ", %t: tensor<?x?xf32>" if with_tab else ""
    return f"""func.func @f(%q: {t}, %k: {t}, %v: {t}, %tab: tensor<?x?xf32>) -> {t} {{
  %s = attn.qk %q, %k : {t}, {t} -> !attn.scores<{H}>
  %m = attn.score_mod %s{extra} {{
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32{arg}):
{body}
  }} : !attn.scores<{H}>
  %p = attn.softmax %m : !attn.scores<{H}> -> !attn.probs<{H}>
  %o = attn.pv %p, %v : !attn.probs<{H}>, {t} -> {t}
  func.return %o : {t}
}}"""


def parsed(body: str, with_tab: bool = False) -> FuncOp:
    return get_func(parse_module(score_mod_text(body, with_tab)))


def unverified(body: str) -> attn.ScoreModOp:
    """The score_mod of `body`, parsed without verification (for ops no region may hold)."""
    ctx = make_context()
    ctx.allow_unregistered = True  # xDSL 0.74 has no arith.remf
    module = Parser(ctx, score_mod_text(body)).parse_module()
    assert isinstance(module, ModuleOp)
    return score_mod_of(get_func(module))


def score_mod_of(func: FuncOp) -> attn.ScoreModOp:
    return next(op for op in func.walk() if isinstance(op, attn.ScoreModOp))


def evaluate(func: FuncOp, op: attn.ScoreModOp, region: Region | None, scores: torch.Tensor) -> torch.Tensor:
    """The value of `op`'s region (or of `region`, with op's extras) on `scores`, by the
    reference executor, broadcast to the scores' shape."""
    executor = _Executor(func, inputs()[0], F64)
    if region is None:
        return torch.broadcast_to(executor._region(op, _Scores(scores, None)), scores.shape)
    with detached_score_mod(op, region) as other:
        return torch.broadcast_to(executor._region(other, _Scores(scores, None)), scores.shape)


@contextmanager
def detached_score_mod(op: attn.ScoreModOp, region: Region, extras: bool = True) -> Iterator[attn.ScoreModOp]:
    """A score_mod on op's input and extras holding a copy of `region`, outside any block;
    erased afterwards (so that it leaves no uses of op's operands)."""
    other = attn.ScoreModOp(op.input, op.extras if extras else [], region.clone())
    try:
        yield other
    finally:
        other.erase()


def verify_region(op: attn.ScoreModOp, region: Region, extras: bool = True) -> None:
    """`region` holds only region ops and verifies as the region of a score_mod like `op`."""
    for inner in region.walk():
        assert isinstance(inner, (*attn.REGION_OPS, attn.YieldOp)), inner.name
    with detached_score_mod(op, region, extras) as other:
        other.verify()


def check_derivative(func: FuncOp, seed: int = 0) -> Region:
    """Compare the derivative region of func's score_mod with autograd; return it."""
    op = score_mod_of(func)
    region = derivative_region(op)
    assert [a.type for a in region.block.args] == [a.type for a in op.body.block.args]
    verify_region(op, region)
    assert region.block.last_op is not None and region.block.last_op.operands[0].type == f32

    scores = inputs(seed)[1].requires_grad_()
    value = evaluate(func, op, None, scores)
    if value.requires_grad:
        (expected,) = torch.autograd.grad(value.sum(), scores)
    else:
        expected = torch.zeros_like(scores)
    got = evaluate(func, op, region, scores.detach())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    return region


def op_names(region: Region) -> list[str]:
    return [op.name for op in region.block.ops]


def constant_value(region: Region) -> float:
    """The value of the region's first op, a float constant."""
    op = region.block.first_op
    assert isinstance(op, arith.ConstantOp) and isinstance(op.value, FloatAttr)
    return op.value.value.data


# --------------------------------------------------------------------------- DSL functions

CASES: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "softcap": lambda tab: lambda s, b, h, qi, kv: af.tanh(s / 20.0) * 20.0,
    "square": lambda tab: lambda s, b, h, qi, kv: s * s,
    "div_constant": lambda tab: lambda s, b, h, qi, kv: s / 3.0,
    "div_index": lambda tab: lambda s, b, h, qi, kv: s / (qi + kv + 1),
    "index_over_score": lambda tab: lambda s, b, h, qi, kv: (qi + 1) / (s * s + 1.0),
    "exp": lambda tab: lambda s, b, h, qi, kv: af.exp(s * 0.5 - h),
    "log_positive": lambda tab: lambda s, b, h, qi, kv: af.log(s * s + 1.0 + kv),
    "select": lambda tab: lambda s, b, h, qi, kv: af.where(s > 0.5, s * 2.0, -s + qi),
    "select_index_condition": lambda tab: lambda s, b, h, qi, kv: af.where(kv <= qi, s, -1e9),
    "select_constants": lambda tab: lambda s, b, h, qi, kv: af.where(s > 0.0, 1.0, 0.5) * s,
    "maximum": lambda tab: lambda s, b, h, qi, kv: af.maximum(s, 0.25 * s),
    "minimum_index": lambda tab: lambda s, b, h, qi, kv: af.minimum(s, qi * 0.3 - 1.0),
    "extract_times_score": lambda tab: lambda s, b, h, qi, kv: tab[h, kv] * s,
    "extract_in_tanh": lambda tab: lambda s, b, h, qi, kv: af.tanh(s * tab[h, kv]) + tab[h, qi],
    "sqrt_rsqrt": lambda tab: lambda s, b, h, qi, kv: af.sqrt(s * s + 1.0) + af.rsqrt(s * s + 2.0),
    "sin_cos": lambda tab: lambda s, b, h, qi, kv: af.sin(s) * af.cos(0.5 * s + h),
    "abs": lambda tab: lambda s, b, h, qi, kv: abs(s - 0.1) * 2.0,
    "exp2_log2": lambda tab: lambda s, b, h, qi, kv: af.exp2(s * 0.3) + af.log2(s * s + 0.5),
    "pow_constant_exponent": lambda tab: lambda s, b, h, qi, kv: (abs(s) + 1.0) ** 1.5 + s**2.0,
    "pow_score_exponent": lambda tab: lambda s, b, h, qi, kv: 1.3**s + (s * s + 1.0) ** (s * 0.1),
    "sigmoid": lambda tab: lambda s, b, h, qi, kv: af.sigmoid(s - kv * 0.2),
    "bool_logic": lambda tab: lambda s, b, h, qi, kv: af.where((s > 0.0) & (kv > 1) | ~(s < -1.0), s * s, s),
    "identity": lambda tab: lambda s, b, h, qi, kv: s,
    "no_score": lambda tab: lambda s, b, h, qi, kv: tab[h, kv] + qi * 0.5,
}


@pytest.mark.parametrize("name", list(CASES))
def test_derivative_agrees_with_autograd(name: str):
    check_derivative(traced(CASES[name]))


def test_the_score_itself_has_derivative_one():
    region = check_derivative(traced(CASES["identity"]))
    assert op_names(region) == ["arith.constant", "attn.yield"]
    assert constant_value(region) == 1.0


def test_a_region_without_the_score_has_derivative_zero():
    region = check_derivative(traced(CASES["no_score"]))
    assert op_names(region) == ["arith.constant", "attn.yield"]
    assert constant_value(region) == 0.0


def test_no_tangent_ops_for_what_does_not_depend_on_the_score():
    """d(s * tab[h, kv]) is tab[h, kv]: the extract is kept, nothing multiplies by 1."""
    region = check_derivative(traced(CASES["extract_times_score"]))
    assert op_names(region) == ["attn.extract", "attn.yield"]


def test_square_is_one_addition():
    region = check_derivative(traced(CASES["square"]))
    assert op_names(region) == ["arith.addf", "attn.yield"]


# --------------------------------------------------------------------------- MLIR text


NUM_AND_CASTS = """    %c = arith.constant 0.25 : f32
    %lo = arith.maxnumf %x, %c : f32
    %hi = arith.minnumf %lo, %x : f32
    %n = arith.negf %hi : f32
    %t = arith.truncf %n : f32 to f16
    %sq = arith.mulf %t, %t : f16
    %e = arith.extf %sq : f16 to f32
    %r = arith.subf %e, %x : f32
    attn.yield %r : f32"""

YIELDS_F16 = """    %t = arith.truncf %x : f32 to f16
    %y = math.tanh %t : f16
    attn.yield %y : f16"""

EXTRACT_INDEX_FROM_POSITIONS = """    %i = arith.subi %ki, %qi : i32
    %e = attn.extract %t[%h, %i] : tensor<?x?xf32>
    %f = arith.sitofp %i : i32 to f32
    %y = arith.mulf %e, %x : f32
    %z = arith.addf %y, %f : f32
    attn.yield %z : f32"""


@pytest.mark.parametrize(
    ("body", "with_tab"),
    [(NUM_AND_CASTS, False), (YIELDS_F16, False), (EXTRACT_INDEX_FROM_POSITIONS, True)],
    ids=["maxnumf_minnumf_casts", "yields_f16", "extract_at_positions"],
)
def test_parsed_regions_agree_with_autograd(body: str, with_tab: bool):
    check_derivative(parsed(body, with_tab))


def test_maxnumf_of_a_nan_takes_the_other_tangent():
    body = """    %nan = arith.constant 0x7FC00000 : f32
    %two = arith.constant 2.0 : f32
    %y = arith.mulf %x, %two : f32
    %m = arith.maxnumf %nan, %y : f32
    attn.yield %m : f32"""
    func = parsed(body)
    op = score_mod_of(func)
    got = evaluate(func, op, derivative_region(op), inputs()[1])
    assert torch.all(got == 2.0)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("body", "op_name", "why"),
    [
        ("    %y = math.floor %x : f32\n    attn.yield %y : f32", "math.floor", "zero almost everywhere"),
        (
            "    %c = arith.constant 2.0 : f32\n"
            '    %y = "arith.remf"(%x, %c) : (f32, f32) -> f32\n    attn.yield %y : f32',
            "arith.remf",
            "no derivative rule",
        ),
        (
            "    %i = arith.fptosi %x : f32 to i32\n    %y = arith.sitofp %i : i32 to f32\n    attn.yield %y : f32",
            "arith.fptosi",
            "rounds",
        ),
        (
            "    %z = arith.constant 0.0 : f32\n    %c = arith.cmpf ogt, %x, %z : f32\n"
            "    %y = arith.uitofp %c : i1 to f32\n    attn.yield %y : f32",
            "arith.uitofp",
            "converts a score-dependent integer",
        ),
        (
            "    %z = arith.constant 0.0 : f32\n    %c = arith.cmpf ogt, %x, %z : f32\n"
            "    %i = arith.extui %c : i1 to i32\n    %y = arith.sitofp %i : i32 to f32\n    attn.yield %y : f32",
            "arith.extui",
            "computes an integer",
        ),
    ],
    ids=["floor", "remf", "fptosi", "bool_to_float", "bool_to_int"],
)
def test_ops_without_a_usable_derivative_are_refused(body: str, op_name: str, why: str):
    with pytest.raises(DiagnosticException) as info:
        derivative_region(unverified(body))
    message = str(info.value)
    assert message.startswith(
        f"attn.score_mod cannot be differentiated: '{op_name}' has no derivative with respect to the score"
    )
    assert why in message


def test_an_int_select_on_a_score_comparison_is_refused():
    with pytest.raises(DiagnosticException, match="'arith.select' has no derivative"):
        derivative_region(score_mod_of(traced(lambda tab: lambda s, b, h, qi, kv: af.where(s > 0.0, 1, 2) * s)))


def test_rounding_a_value_independent_of_the_score_is_fine():
    """floor of a position is a constant here: the derivative is that of s * it."""
    body = """    %f = arith.sitofp %qi : i32 to f32
    %c = arith.constant 0.5 : f32
    %g = arith.mulf %f, %c : f32
    %i = arith.fptosi %g : f32 to i32
    %j = arith.sitofp %i : i32 to f32
    %y = arith.mulf %x, %j : f32
    attn.yield %y : f32"""
    check_derivative(parsed(body))


# --------------------------------------------------------------------------- fixed regions


def test_constant_derivative_region():
    func = traced(CASES["extract_times_score"])
    op = score_mod_of(func)
    region = constant_derivative_region([a.type for a in op.body.block.args], 0.75)
    verify_region(op, region)
    assert op_names(region) == ["arith.constant", "attn.yield"]
    got = evaluate(func, op, region, inputs()[1])
    assert torch.all(got == 0.75)


@pytest.mark.parametrize("cap", [5.0, 30.0])
def test_softcap_derivative_region(cap: float):
    """1 - (x / cap)^2 at x = cap tanh(s / cap) is d(cap tanh(s / cap))/ds."""
    func = traced(CASES["identity"])
    op = score_mod_of(func)
    region = softcap_derivative_region(cap)
    assert [a.type for a in region.block.args] == [f32, i32, i32, i32, i32]
    verify_region(op, region, extras=False)
    scores = (inputs()[1] * 4).requires_grad_()
    capped = cap * torch.tanh(scores / cap)
    (expected,) = torch.autograd.grad(capped.sum(), scores)
    got = evaluate(func, op, region, capped.detach())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
