"""Lists the dialect, the reference executor and the Triton lowering must agree on.

The ops a mask, bias or score_mod region may hold: the dialect's allow-list
(`attn.REGION_OPS`, checked by the verifier) is exactly what the reference executor runs
and what the lowering translates; the ops new to the reference agree with plain
formulas. And every KV-bounded mask kind has its KV range in the lowering."""

from __future__ import annotations

import math

import pytest
import torch
from xdsl.dialects import arith

from attnfuse.dialects import attn
from attnfuse.passes.kv_segments import KV_RANGES
from attnfuse.passes.region_to_tl import REGION_LOWERINGS
from attnfuse.reference import REGION_OP_NAMES, run_reference

ALLOWED = {op.name for op in attn.REGION_OPS}


def test_the_reference_runs_exactly_the_allow_list():
    assert set(REGION_OP_NAMES) == ALLOWED


def test_the_lowering_translates_exactly_the_allow_list():
    assert set(REGION_LOWERINGS) == set(attn.REGION_OPS)


def score_mod_ir(body: str, head: int = 2, d: int = 16) -> str:
    t = f"tensor<?x{head}x?x{d}xf32>"
    return f"""func.func @f(%q: {t}, %k: {t}, %v: {t}) -> {t} {{
  %s = attn.qk %q, %k : {t}, {t} -> !attn.scores<{head}>
  %t = attn.score_mod %s {{
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
{body}
  }} : !attn.scores<{head}>
  %p = attn.softmax %t : !attn.scores<{head}> -> !attn.probs<{head}>
  %o = attn.pv %p, %v : !attn.probs<{head}>, {t} -> {t}
  func.return %o : {t}
}}"""


def plain_attention(q, k, v, score):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(score(s), dim=-1) @ v


@pytest.mark.parametrize(
    ("op", "fn"),
    [("arith.maxnumf", lambda s, c: torch.clamp(s, min=c)), ("arith.minnumf", lambda s, c: torch.clamp(s, max=c))],
)
def test_maxnumf_minnumf(op, fn):
    body = f"""    %c = arith.constant 0.25 : f32
    %y = {op} %x, %c : f32
    attn.yield %y : f32"""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64) for _ in range(3))
    out = run_reference(score_mod_ir(body), q, k, v)
    torch.testing.assert_close(out, plain_attention(q, k, v, lambda s: fn(s, 0.25)))


def test_maxnumf_ignores_a_nan_operand():
    body = """    %nan = arith.constant 0x7FC00000 : f32
    %y = arith.maxnumf %nan, %x : f32
    attn.yield %y : f32"""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64) for _ in range(3))
    out = run_reference(score_mod_ir(body), q, k, v)
    torch.testing.assert_close(out, plain_attention(q, k, v, lambda s: s))


def test_uitofp_reads_the_bits_unsigned():
    """kv_idx - q_idx is negative below the diagonal: as an unsigned i32 it is 2^32 + it."""
    body = """    %d = arith.subi %ki, %qi : i32
    %u = arith.uitofp %d : i32 to f32
    %small = arith.constant 1.0e-09 : f32
    %y = arith.mulf %u, %small : f32
    attn.yield %y : f32"""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64) for _ in range(3))
    out = run_reference(score_mod_ir(body), q, k, v)
    pos = torch.arange(8)
    d = (pos[None, :] - pos[:, None]).to(torch.float64)
    unsigned = torch.where(d < 0, d + 2.0**32, d)
    expected = torch.softmax(unsigned * 1e-9, dim=-1) @ v
    torch.testing.assert_close(out, expected)


def test_the_lowering_bounds_every_kv_bounded_mask_kind():
    """causal-split may classify a mask by any kv_bounded kind; the lowering has its KV range."""
    assert set(KV_RANGES) == {k.name for k in attn.MASK_KINDS.values() if k.kv_bounded}


# The same ops in generated kernels, under the Triton interpreter, against the reference.

SCORE_MOD_MAXNUMF = """attn.score_mod {s} {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.constant 0.25 : f32
    %lo = arith.maxnumf %x, %c : f32
    %d = arith.constant -0.25 : f32
    %y = arith.minnumf %lo, %d : f32
    attn.yield %y : f32
  }"""

# Keeps kv_idx - q_idx in [0, 1e9) read as unsigned: the keys at or after the query.
MASK_UITOFP = """attn.mask {s} custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %d = arith.subi %ki, %qi : i32
    %u = arith.uitofp %d : i32 to f32
    %lim = arith.constant 1.0e9 : f32
    %keep = arith.cmpf olt, %u, %lim : f32
    attn.yield %keep : i1
  }"""


@pytest.mark.parametrize("region", [SCORE_MOD_MAXNUMF, MASK_UITOFP], ids=["maxnumf_minnumf", "uitofp"])
def test_kernel_agrees_with_the_reference(region, tmp_path):
    from kernel_harness import check, qkv, variant

    check(variant(score_ops=[region]), qkv(nq=40), tmp_path)


def cmpf_score_mod(pred: str) -> str:
    """A score_mod whose value shows arith.cmpf <pred> on ordinary operands and on NaN."""
    return f"""attn.score_mod {{s}} {{
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %zero = arith.constant 0.0 : f32
    %zx = arith.mulf %x, %zero : f32
    %nan = arith.divf %zx, %zx : f32
    %half = arith.constant 0.5 : f32
    %one = arith.constant 1.0 : f32
    %c = arith.cmpf {pred}, %x, %zero : f32
    %n = arith.cmpf {pred}, %x, %nan : f32
    %xs = arith.mulf %x, %half : f32
    %y = arith.select %c, %x, %xs : f32
    %bump = arith.select %n, %one, %zero : f32
    %r = arith.addf %y, %bump : f32
    attn.yield %r : f32
  }}"""


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")  # the interpreter's 0 / 0
@pytest.mark.parametrize("pred", arith.CMPF_COMPARISON_OPERATIONS)
def test_kernel_cmpf_with_nan_agrees_with_the_reference(pred, tmp_path):
    """Every arith.cmpf predicate, NaN operands included (ordered ones are false, unordered true)."""
    from kernel_harness import check, qkv, variant

    check(variant(score_ops=[cmpf_score_mod(pred)]), qkv(nq=24), tmp_path)
