"""Derivatives of `attn.score_mod` regions with respect to the score, for `attn-autodiff`.

`derivative_region(op)` differentiates the region of a score_mod symbolically, in forward
mode, op by op: each op of the region is copied, followed by the ops computing its tangent
(its derivative with respect to the score) from its operands' tangents. The result is a
region of the same signature as the score_mod's whose value is d(yielded value)/d(score),
as f32, built from the ops of `attn.REGION_OPS` only, so that the reference executor and
the Triton lowering (`region_to_tl`) run it as they run any region.

Tangents are known to be zero for values that do not depend on the score, and no op is
emitted for them; the score's own tangent is the constant 1.0, folded into the products
it meets. Repeated ops are merged, and ops left unused at the end (copies the derivative
does not read) are erased.

Piecewise ops differentiate the piece they select: `arith.select` (whatever its condition),
`maximumf`/`minimumf`/`maxnumf`/`minnumf` (ties pick the first operand), `math.absf`
(+1 at 0). Comparisons of the score give booleans that may be combined (`andi`, `ori`,
`xori`, `cmpi`, `select` on i1) and used as select conditions. Anything else that turns a
score-dependent value into an integer or reads through one (`fptosi`, integer
arithmetic, a bool-to-float cast, `attn.extract` at a score-dependent index) is refused,
as is any op without a derivative rule (e.g. `math.floor`, `arith.remf`): a derivative that
is zero almost everywhere would give a silently zero gradient. A refusal raises a
`DiagnosticException` naming the op.

Extra tensors are constants here: `attn.extract` has a zero tangent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from xdsl.dialects import arith
from xdsl.dialects import math as math_dialect
from xdsl.dialects.builtin import AnyFloat, FloatAttr, UnregisteredOp, f32, i1, i32
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.transforms.common_subexpression_elimination import cse
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn

CANNOT = "attn.score_mod cannot be differentiated"
"""The start of every refusal's message."""

ROUNDING_OPS = frozenset(
    {
        "math.floor",
        "math.ceil",
        "math.round",
        "math.roundeven",
        "math.trunc",
        "arith.fptosi",
        "arith.fptoui",
    }
)
"""Ops that round a float: their derivative is zero almost everywhere, and refused."""

ROUNDS = "it rounds a score-dependent value, and its derivative is zero almost everywhere"
TO_FLOAT = "it converts a score-dependent integer to a float: a step function, its derivative zero almost everywhere"


def refusal(op: Operation, why: str) -> DiagnosticException:
    """The error for an op of the region that has no usable derivative (an unregistered
    op by the name it was written with)."""
    name = op.op_name.data if isinstance(op, UnregisteredOp) else op.name
    return DiagnosticException(f"{CANNOT}: '{name}' has no derivative with respect to the score ({why})")


def _float_constant(value: SSAValue) -> float | None:
    """The value of `value` when it is a float arith.constant, else None."""
    owner = value.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, FloatAttr):
        return float(owner.value.value.data)
    return None


def _float_width(t: Attribute) -> int:
    assert isinstance(t, AnyFloat)
    return t.bitwidth


class _Differentiator:
    """Builds the derivative region of one score_mod region.

    `values` maps the original region's values to their copies in the new block;
    `tangents` maps a float copy that depends on the score to its tangent (absent: zero);
    `dependent` holds the integer (boolean) copies that depend on the score."""

    def __init__(self, arg_types: Sequence[Attribute]):
        self.region, self.block = attn.new_region(arg_types)
        self.values: dict[SSAValue, SSAValue] = {}
        self.tangents: dict[SSAValue, SSAValue] = {}
        self.dependent: set[SSAValue] = set()
        self.constants: dict[tuple[float, Attribute], SSAValue] = {}

    # ------------------------------------------------------------------ emitting ops

    def emit(self, op: Operation) -> SSAValue:
        """Append `op` to the new block; its (single) result."""
        self.block.add_op(op)
        return op.results[0]

    def const(self, value: float, t: Attribute = f32) -> SSAValue:
        """A float constant of type `t`, emitted once."""
        assert isinstance(t, AnyFloat), t
        key = (value, t)
        if key not in self.constants:
            self.constants[key] = self.emit(arith.ConstantOp(FloatAttr(value, t)))
        return self.constants[key]

    def like(self, value: float, x: SSAValue) -> SSAValue:
        """A float constant of x's type."""
        return self.const(value, x.type)

    def add(self, a: SSAValue | None, b: SSAValue | None) -> SSAValue | None:
        """a + b, None standing for 0."""
        if a is None or b is None:
            return a if b is None else b
        return self.emit(arith.AddfOp(a, b))

    def sub(self, a: SSAValue | None, b: SSAValue | None) -> SSAValue | None:
        """a - b, None standing for 0."""
        if b is None:
            return a
        if a is None:
            return self.neg(b)
        return self.emit(arith.SubfOp(a, b))

    def neg(self, a: SSAValue) -> SSAValue:
        c = _float_constant(a)
        return self.like(-c, a) if c is not None else self.emit(arith.NegfOp(a))

    def mul(self, a: SSAValue | None, b: SSAValue | None) -> SSAValue | None:
        """a * b, None standing for 0; a factor 1.0 is dropped."""
        if a is None or b is None:
            return None
        if _float_constant(a) == 1.0:
            return b
        if _float_constant(b) == 1.0:
            return a
        return self.emit(arith.MulfOp(a, b))

    def mul_const(self, a: SSAValue | None, c: float) -> SSAValue | None:
        """a * c for a Python float c."""
        return None if a is None else self.mul(a, self.like(c, a))

    def div(self, a: SSAValue | None, b: SSAValue) -> SSAValue | None:
        """a / b, None standing for 0."""
        if a is None:
            return None
        return a if _float_constant(b) == 1.0 else self.emit(arith.DivfOp(a, b))

    def select(self, cond: SSAValue, a: SSAValue | None, b: SSAValue | None, t: Attribute) -> SSAValue | None:
        """cond ? a : b of float type `t`, None standing for 0."""
        if a is None and b is None:
            return None
        if a is None:
            a = self.const(0.0, t)
        if b is None:
            b = self.const(0.0, t)
        return self.emit(arith.SelectOp(cond, a, b))

    def cmpf(self, a: SSAValue, b: SSAValue, predicate: str) -> SSAValue:
        return self.emit(arith.CmpfOp(a, b, predicate))

    # ------------------------------------------------------------------ the walk

    def run(self, block: Block) -> Region:
        """Differentiate `block` (score first among its arguments) into the new region."""
        for old, new in zip(block.args, self.block.args, strict=True):
            self.values[old] = new
        self.tangents[self.block.args[0]] = self.const(1.0)
        for op in block.ops:
            if isinstance(op, attn.YieldOp):
                self.finish(self.values[op.values[0]])
                return self.region
            self.step(op)
        raise DiagnosticException(f"{CANNOT}: its region has no attn.yield")

    def depends(self, value: SSAValue) -> bool:
        return value in self.tangents or value in self.dependent

    def step(self, op: Operation) -> None:
        """Copy `op` into the new block, then emit its tangent."""
        new = op.clone(value_mapper=self.values)
        self.block.add_op(new)
        for old, result in zip(op.results, new.results, strict=True):
            self.values[old] = result
        if not any(self.depends(x) for x in new.operands):
            return
        if len(new.results) != 1:
            raise refusal(op, "it is not a region op")
        result = new.results[0]
        if isinstance(result.type, AnyFloat):
            tangent = self.float_tangent(new)
            if tangent is not None:
                self.tangents[result] = tangent
        else:
            self.integer_result(new)
            self.dependent.add(result)

    def float_tangent(self, op: Operation) -> SSAValue | None:
        """The tangent of a float-valued op with an operand that depends on the score."""
        if isinstance(op, arith.SelectOp):
            t = self.tangents.get
            return self.select(op.cond, t(op.lhs), t(op.rhs), op.result.type)
        if op.name in ROUNDING_OPS:
            raise refusal(op, ROUNDS)
        if any(x in self.dependent for x in op.operands):
            if isinstance(op, attn.ExtractOp):
                raise refusal(op, "it reads an extra tensor at a score-dependent index")
            raise refusal(op, TO_FLOAT)
        rule = DERIVATIVES.get(type(op))
        if rule is None:
            raise refusal(op, "AttnFuse has no derivative rule for it")
        return rule(self, op, [self.tangents.get(x) for x in op.operands])

    def integer_result(self, op: Operation) -> None:
        """Check an integer-valued op with an operand that depends on the score: only
        comparisons of floats and logic on the booleans they give are allowed."""
        if isinstance(op, arith.CmpfOp):
            return
        if op.name in ROUNDING_OPS:
            raise refusal(op, ROUNDS)
        if isinstance(op, attn.ExtractOp):
            raise refusal(op, "it reads an extra tensor at a score-dependent index")
        booleans = op.results[0].type == i1 and all(x.type == i1 for x in op.operands if self.depends(x))
        if not booleans or any(x in self.tangents for x in op.operands):
            raise refusal(op, "it computes an integer from the score, and its derivative is zero almost everywhere")

    def finish(self, value: SSAValue) -> None:
        """Yield the tangent of `value` as f32, then merge repeated ops (the copied and the
        new constants, a product the derivative computes again) and erase the ops nothing
        reads."""
        tangent = self.tangents.get(value)
        if tangent is None:
            if value in self.dependent:
                raise DiagnosticException(f"{CANNOT}: its yielded value is not a float")
            tangent = self.const(0.0)
        elif tangent.type != f32:
            width = _float_width(tangent.type)
            tangent = self.emit(arith.ExtFOp(tangent, f32) if width < 32 else arith.TruncFOp(tangent, f32))
        self.block.add_op(attn.YieldOp(tangent))
        cse(self.block)
        for op in reversed(list(self.block.ops)):
            if not isinstance(op, attn.YieldOp) and not any(r.uses for r in op.results):
                self.block.erase_op(op)


# --------------------------------------------------------------------------- derivative rules

Rule = Callable[[_Differentiator, Operation, list[SSAValue | None]], SSAValue | None]
"""(differentiator, the op's copy, its operands' tangents: None for zero) -> its tangent."""


def _addf(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
    return d.add(t[0], t[1])


def _subf(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
    return d.sub(t[0], t[1])


def _mulf(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
    """d(ab) = da b + a db."""
    a, b = op.operands
    return d.add(d.mul(t[0], b), d.mul(a, t[1]))


def _divf(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
    """d(a/b) = (da - (a/b) db) / b."""
    b = op.operands[1]
    return d.div(d.sub(t[0], d.mul(op.results[0], t[1])), b)


def _negf(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
    return None if t[0] is None else d.neg(t[0])


def _pick(predicate: str, nan_picks_first: bool) -> Rule:
    """max/min: the tangent of the operand it selects; a tie picks the first. With
    `nan_picks_first` (maxnumf, minnumf), a NaN second operand picks the first too."""

    def rule(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
        a, b = op.operands
        cond = d.cmpf(a, b, predicate)
        if nan_picks_first:
            cond = d.emit(arith.OrIOp(cond, d.cmpf(b, b, "uno")))
        return d.select(cond, t[0], t[1], op.results[0].type)

    return rule


def _unary(derivative: Callable[[_Differentiator, SSAValue, SSAValue], SSAValue]) -> Rule:
    """The rule of y = f(x) from f'(x), given (differentiator, x, y): dy = f'(x) dx."""

    def rule(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
        return d.mul(derivative(d, op.operands[0], op.results[0]), t[0])

    return rule


def _tanh(d: _Differentiator, x: SSAValue, y: SSAValue) -> SSAValue:
    """1 - tanh(x)^2."""
    square = d.mul(y, y)
    assert square is not None
    return d.emit(arith.SubfOp(d.like(1.0, y), square))


def _rsqrt(d: _Differentiator, x: SSAValue, y: SSAValue) -> SSAValue:
    """-x^(-3/2) / 2 = -y^3 / 2."""
    cube = d.mul(d.mul(y, y), y)
    assert cube is not None
    return d.emit(arith.MulfOp(cube, d.like(-0.5, y)))


def _absf(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
    """-dx where x < 0, else dx."""
    x, dx = op.operands[0], t[0]
    assert dx is not None
    negative = d.cmpf(x, d.like(0.0, x), "olt")
    return d.select(negative, d.neg(dx), dx, x.type)


def _powf(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
    """d(a^b) = b a^(b-1) da + a^b log(a) db."""
    a, b = op.operands
    y = op.results[0]
    by_base = None
    if t[0] is not None:
        c = _float_constant(b)
        b_minus_1 = d.like(c - 1.0, b) if c is not None else d.emit(arith.SubfOp(b, d.like(1.0, b)))
        factor = d.emit(math_dialect.PowFOp(a, b_minus_1)) if _float_constant(b_minus_1) != 1.0 else a
        by_base = d.mul(d.mul(b, factor), t[0])
    by_exponent = None
    if t[1] is not None:
        by_exponent = d.mul(d.mul(y, d.emit(math_dialect.LogOp(a))), t[1])
    return d.add(by_base, by_exponent)


def _cast(cls: type[arith.ExtFOp] | type[arith.TruncFOp]) -> Rule:
    """extf/truncf: the tangent cast as the value is."""

    def rule(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
        return None if t[0] is None else d.emit(cls(t[0], op.results[0].type))

    return rule


def _log(scale: float) -> Rule:
    """log (scale 1) and log2 (scale 1 / ln 2): d(scale log x) = scale dx / x."""

    def rule(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
        return d.div(d.mul_const(t[0], scale) if scale != 1.0 else t[0], op.operands[0])

    return rule


def _sqrt(d: _Differentiator, op: Operation, t: list[SSAValue | None]) -> SSAValue | None:
    """d sqrt(x) = dx / (2 sqrt(x))."""
    return d.div(d.mul_const(t[0], 0.5), op.results[0])


DERIVATIVES: dict[type[Operation], Rule] = {
    arith.AddfOp: _addf,
    arith.SubfOp: _subf,
    arith.MulfOp: _mulf,
    arith.DivfOp: _divf,
    arith.NegfOp: _negf,
    arith.MaximumfOp: _pick("oge", nan_picks_first=False),
    arith.MinimumfOp: _pick("ole", nan_picks_first=False),
    arith.MaxnumfOp: _pick("oge", nan_picks_first=True),
    arith.MinnumfOp: _pick("ole", nan_picks_first=True),
    math_dialect.ExpOp: _unary(lambda d, x, y: y),
    math_dialect.Exp2Op: _unary(lambda d, x, y: d.emit(arith.MulfOp(y, d.like(math.log(2.0), y)))),
    math_dialect.LogOp: _log(1.0),
    math_dialect.Log2Op: _log(1.0 / math.log(2.0)),
    math_dialect.TanhOp: _unary(_tanh),
    math_dialect.SqrtOp: _sqrt,
    math_dialect.RsqrtOp: _unary(_rsqrt),
    math_dialect.AbsFOp: _absf,
    math_dialect.SinOp: _unary(lambda d, x, y: d.emit(math_dialect.CosOp(x))),
    math_dialect.CosOp: _unary(lambda d, x, y: d.neg(d.emit(math_dialect.SinOp(x)))),
    math_dialect.PowFOp: _powf,
    arith.ExtFOp: _cast(arith.ExtFOp),
    arith.TruncFOp: _cast(arith.TruncFOp),
}
"""The derivative rule of each float op of `attn.REGION_OPS` that has one (select and the
casts from integers are handled by `_Differentiator.float_tangent`)."""


# --------------------------------------------------------------------------- public API


def derivative_region(op: attn.ScoreModOp) -> Region:
    """A new region with the entry-block argument types of `op.body` (score: f32, b, h,
    q_idx, kv_idx: i32, then one per extra tensor) computing d(yielded value)/d(score) as
    f32 with the ops of `attn.REGION_OPS`, ended by `attn.yield`. Raises a
    `DiagnosticException` naming the op when the region has an op without a usable
    derivative."""
    block = op.body.blocks[0]
    return _Differentiator([a.type for a in block.args]).run(block)


def constant_derivative_region(arg_types: Sequence[Attribute], value: float) -> Region:
    """A region of entry-block arguments `arg_types` yielding the f32 constant `value`."""
    region, block = attn.new_region(arg_types)
    c = arith.ConstantOp(FloatAttr(value, f32))
    block.add_ops([c, attn.YieldOp(c)])
    return region


def softcap_derivative_region(cap: float) -> Region:
    """The region of a score_mod on the capped score x = cap tanh(s / cap) (arguments
    f32, then i32 x4) yielding 1 - (x / cap)^2, the derivative of the softcap through its
    output."""
    region, block = attn.new_region([f32, i32, i32, i32, i32])
    x = block.args[0]
    c = arith.ConstantOp(FloatAttr(cap, f32))
    t = arith.DivfOp(x, c)
    square = arith.MulfOp(t, t)
    one = arith.ConstantOp(FloatAttr(1.0, f32))
    result = arith.SubfOp(one, square)
    block.add_ops([c, t, square, one, result, attn.YieldOp(result)])
    return region
