"""Custom mask, bias and score_mod regions as tl tile expressions.

Each op of `attn.REGION_OPS` has a builder in `REGION_LOWERINGS`: it receives the op's
operands already lowered (tiles over the block's queries and keys, or scalars) and
returns the op's value. Region integers are i32 in the kernel (positions and indices).

Two cases are defined as in the reference executor (attnfuse/reference.py), so that every
backend gives one answer:
- integer division by zero: `x divsi 0 = x floordivsi 0 = 0` and `x remsi 0 = x` (so
  x = (x / y) * y + x % y still holds); the kernel divides by 1 where the divisor is 0
  and selects the defined result;
- `attn.extract` outside the tensor's bounds (any index < 0 or >= its size) reads 0
  (false for a bool tensor): the load is masked to the bounds. Its address is computed
  in int64, as the tensor may pass 2^31 elements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects import arith, math
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, IntegerType, f32, i1, i32, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn, tl
from attnfuse.passes.tl_builder import KernelBuilder, TensorParam, Value


@dataclass
class RegionEnv:
    """What region ops read besides their operands."""

    extras: dict[SSAValue, TensorParam]
    """The region's extra-tensor arguments, as kernel tensor parameters."""
    valid: SSAValue | None
    """The (query, key) pairs in range: the mask of a load indexed by a tile (None: all are,
    as in the sm90 Gluon kernel's score functions)."""
    fast_tanh: bool = False
    """tanh by the GPU's approximate instruction (`tl.fast_tanh`; kernel-path's `tanh =
    "approx"`, never in an interpreted kernel)."""


RegionLowering = Callable[[KernelBuilder, Operation, list[SSAValue], RegionEnv], SSAValue]
"""(builder, op, lowered operands, env) -> the op's lowered value."""


def lower_region(
    kb: KernelBuilder,
    op: attn.MaskOp | attn.BiasOp | attn.ScoreModOp,
    args: Sequence[SSAValue],
    env: RegionEnv,
) -> SSAValue:
    """Lower the region of `op`, whose leading block arguments take `args` ([score,] b, h,
    q_idx, kv_idx), and return its yielded value."""
    block = op.body.blocks[0]
    values: dict[SSAValue, SSAValue] = dict(zip(block.args[: len(args)], args, strict=True))
    values.update((arg, t.ptr) for arg, t in env.extras.items())
    for inner in block.ops:
        if isinstance(inner, attn.YieldOp):
            return values[inner.values[0]]
        lowering = REGION_LOWERINGS.get(type(inner))
        if lowering is None:
            raise DiagnosticException(f"'{inner.name}' in an {op.name} region has no Triton lowering")
        values[inner.results[0]] = lowering(kb, inner, [values[x] for x in inner.operands], env)
    raise DiagnosticException(f"{op.name} region has no attn.yield")


def _binary(build: Callable[[KernelBuilder, Value, Value], SSAValue]) -> RegionLowering:
    return lambda kb, op, o, env: build(kb, o[0], o[1])


def _unary(cls: type[tl.UnaryOp]) -> RegionLowering:
    return lambda kb, op, o, env: kb.unary(cls, o[0])


def _cast(element: Attribute) -> RegionLowering:
    return lambda kb, op, o, env: kb.cast(o[0], element)


def _is_bool(x: SSAValue) -> bool:
    return tl.scalar_of(x.type) == i1


def _constant(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    assert isinstance(op, arith.ConstantOp)
    val = op.value
    if isinstance(val, IntegerAttr):
        return kb.value(bool(val.value.data) if val.type == i1 else int(val.value.data))
    if isinstance(val, FloatAttr):
        return kb.value(float(val.value.data))
    raise DiagnosticException(f"unsupported constant {val} in a region")


def _nonzero_constant(x: SSAValue) -> bool:
    owner = x.owner
    return isinstance(owner, tl.ConstantOp) and owner.literal != 0


def _divisor(kb: KernelBuilder, y: SSAValue) -> tuple[SSAValue | None, SSAValue]:
    """(where y is 0, or None when y is a nonzero constant; y with 1 for 0): a division
    by the second is defined everywhere, and its result is replaced where y is 0."""
    if _nonzero_constant(y):
        return None, y
    zero = kb.cmp("==", y, 0)
    return zero, kb.where(zero, 1, y)


def _by_zero(kb: KernelBuilder, zero: SSAValue | None, value: Value, result: SSAValue) -> SSAValue:
    """`result`, or `value` where the divisor was 0."""
    return result if zero is None else kb.where(zero, value, result)


def _divsi(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """Truncating, as arith.divsi and Triton's //; x / 0 = 0."""
    zero, y = _divisor(kb, o[1])
    return _by_zero(kb, zero, 0, kb.floordiv(o[0], y))


def _remsi(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """The sign of the dividend, as arith.remsi and Triton's %; x % 0 = x."""
    zero, y = _divisor(kb, o[1])
    return _by_zero(kb, zero, o[0], kb.rem(o[0], y))


def _floordivsi(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """Python's // truncates in Triton: step down where the signs differ and a remainder is
    left; x // 0 = 0."""
    zero, y = _divisor(kb, o[1])
    q = kb.floordiv(o[0], y)
    r = kb.rem(o[0], y)
    adjust = kb.and_(kb.cmp("!=", r, 0), kb.cmp("!=", kb.cmp("<", o[0], 0), kb.cmp("<", y, 0)))
    return _by_zero(kb, zero, 0, kb.sub(q, kb.cast(adjust, i32)))


CMPI_OPERATORS = {
    "eq": "==",
    "ne": "!=",
    "slt": "<",
    "sle": "<=",
    "sgt": ">",
    "sge": ">=",
    "ult": "<",
    "ule": "<=",
    "ugt": ">",
    "uge": ">=",
}
"""arith.cmpi predicates (xDSL's names) as Triton operators; `u*` compare unsigned."""

CMPF_OPERATORS = {"oeq": "==", "ogt": ">", "oge": ">=", "olt": "<", "ole": "<=", "une": "!="}
"""The arith.cmpf predicates that are one Triton operator: a Triton comparison with a NaN
operand is false, except `!=`, which is true."""

CMPF_NEGATED = {"ugt": "<=", "uge": "<", "ult": ">=", "ule": ">"}
"""Unordered predicates that hold where the opposite Triton comparison does not."""


def _cmpi(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    assert isinstance(op, arith.CmpiOp)
    pred = arith.CMPI_COMPARISON_OPERATIONS[op.predicate.value.data]
    a, b = o
    if pred.startswith("u") and not _is_bool(a):
        # Unsigned order is signed order with the sign bit flipped (kernel ints are i32).
        a, b = (kb.xor(x, -(1 << 31)) for x in (a, b))
    return kb.cmp(CMPI_OPERATORS[pred], a, b)


def _cmpf(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """MLIR's ordered predicates are false, its unordered ones true, when an operand is NaN."""
    assert isinstance(op, arith.CmpfOp)
    pred = arith.CMPF_COMPARISON_OPERATIONS[op.predicate.value.data]
    a, b = o
    if pred in CMPF_OPERATORS:
        return kb.cmp(CMPF_OPERATORS[pred], a, b)
    if pred in CMPF_NEGATED:
        return kb.xor(kb.cmp(CMPF_NEGATED[pred], a, b), True)
    if pred in ("ord", "one"):
        ordered = kb.and_(kb.cmp("==", a, a), kb.cmp("==", b, b))
        return ordered if pred == "ord" else kb.and_(ordered, kb.cmp("!=", a, b))
    if pred in ("uno", "ueq"):
        unordered = kb.or_(kb.cmp("!=", a, a), kb.cmp("!=", b, b))
        return unordered if pred == "uno" else kb.or_(kb.cmp("==", a, b), unordered)
    return kb.value(pred == "true")  # false, true


def _signed_to(element: Attribute) -> RegionLowering:
    """sitofp / extsi: a signed i1 true is -1 (MLIR), while Triton converts True to 1."""

    def lower(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
        if _is_bool(o[0]):
            return kb.sub(0, kb.cast(o[0], element))
        return kb.cast(o[0], element)

    return lower


def _uitofp(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """The operand's unsigned value: a negative one is 2^width more than its signed value."""
    x = kb.cast(o[0], f32)
    if _is_bool(o[0]):
        return x
    t = op.operands[0].type
    width = t.width.data if isinstance(t, IntegerType) else 64
    return kb.add(x, kb.where(kb.cmp("<", o[0], 0), float(2**width), 0.0))


def _to_i32(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """fptosi, trunci, index_cast: an i1 stays a boolean."""
    return o[0] if _is_bool(o[0]) else kb.cast(o[0], i32)


def _tanh(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """tanh(x) = 2 sigmoid(2x) - 1, or the approximate instruction."""
    if env.fast_tanh:
        return kb.unary(tl.FastTanhOp, o[0])
    two_x = kb.mul(o[0], 2.0)
    return kb.sub(kb.mul(kb.unary(tl.SigmoidOp, two_x), 2.0), 1.0)


def _powf(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """x^y = exp2(y log2 x)."""
    return kb.unary(tl.Exp2Op, kb.mul(o[1], kb.unary(tl.Log2Op, o[0])))


def _extract(kb: KernelBuilder, op: Operation, o: list[SSAValue], env: RegionEnv) -> SSAValue:
    """A load from the extra tensor at int64 offsets, masked to the tensor's bounds (an
    index outside them reads 0) and, when a tile indexes it, to the valid pairs."""
    assert isinstance(op, attn.ExtractOp)
    t = env.extras[op.tensor]
    ptr = t.ptr
    inside: SSAValue | None = None
    tile_index = False
    for idx, stride, size in zip(o[1:], t.strides, t.sizes, strict=True):
        ok = kb.and_(kb.cmp(">=", idx, 0), kb.cmp("<", idx, size))
        inside = ok if inside is None else kb.and_(inside, ok)
        ptr = kb.add(ptr, kb.mul(kb.cast(idx, i64), stride))
        tile_index |= tl.is_tile(idx.type)
    mask = kb.and_(env.valid, inside) if tile_index and inside is not None and env.valid is not None else inside
    return kb.load(ptr, mask, 0)


REGION_LOWERINGS: dict[type[Operation], RegionLowering] = {
    attn.ExtractOp: _extract,
    arith.ConstantOp: _constant,
    # integer arithmetic
    arith.AddiOp: _binary(KernelBuilder.add),
    arith.SubiOp: _binary(KernelBuilder.sub),
    arith.MuliOp: _binary(KernelBuilder.mul),
    arith.DivSIOp: _divsi,
    arith.FloorDivSIOp: _floordivsi,
    arith.RemSIOp: _remsi,
    arith.MaxSIOp: _binary(KernelBuilder.maximum),
    arith.MinSIOp: _binary(KernelBuilder.minimum),
    arith.AndIOp: _binary(KernelBuilder.and_),
    arith.OrIOp: _binary(KernelBuilder.or_),
    arith.XOrIOp: _binary(KernelBuilder.xor),
    math.AbsIOp: _unary(tl.AbsOp),
    # float arithmetic
    arith.AddfOp: _binary(KernelBuilder.add),
    arith.SubfOp: _binary(KernelBuilder.sub),
    arith.MulfOp: _binary(KernelBuilder.mul),
    arith.DivfOp: _binary(KernelBuilder.div),
    arith.NegfOp: _unary(tl.NegOp),
    arith.MaximumfOp: _binary(KernelBuilder.maximum),
    arith.MinimumfOp: _binary(KernelBuilder.minimum),
    arith.MaxnumfOp: _binary(KernelBuilder.maximum),
    arith.MinnumfOp: _binary(KernelBuilder.minimum),
    math.ExpOp: _unary(tl.ExpOp),
    math.Exp2Op: _unary(tl.Exp2Op),
    math.LogOp: _unary(tl.LogOp),
    math.Log2Op: _unary(tl.Log2Op),
    math.TanhOp: _tanh,
    math.SqrtOp: _unary(tl.SqrtOp),
    math.RsqrtOp: _unary(tl.RsqrtOp),
    math.AbsFOp: _unary(tl.AbsOp),
    math.SinOp: _unary(tl.SinOp),
    math.CosOp: _unary(tl.CosOp),
    math.PowFOp: _powf,
    # comparisons and selection
    arith.CmpiOp: _cmpi,
    arith.CmpfOp: _cmpf,
    arith.SelectOp: lambda kb, op, o, env: kb.where(o[0], o[1], o[2]),
    # casts
    arith.SIToFPOp: _signed_to(f32),
    arith.UIToFPOp: _uitofp,
    arith.FPToSIOp: _to_i32,
    arith.ExtSIOp: _signed_to(i32),
    arith.ExtUIOp: _cast(i32),  # booleans in arithmetic: True -> 1
    arith.TruncIOp: _to_i32,
    arith.IndexCastOp: _to_i32,
    arith.ExtFOp: _cast(f32),
    arith.TruncFOp: _cast(f32),
}
"""A builder for each op of `attn.REGION_OPS` (python_tests/test_region_ops.py checks
that the two lists agree)."""
