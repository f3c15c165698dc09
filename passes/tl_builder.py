"""Building tl IR: a kernel's body op by op, its parameters as they are first needed.

`Params` collects a kernel's arguments, each bound to the host expression the launcher
passes for it; `KernelBuilder` appends tl ops to a block, turning Python numbers into
`tl.constant`s. convert-attn-to-tl builds its kernels with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import IntegerType, f32, i32
from xdsl.ir import Attribute, Block, Operation, SSAValue

from attnfuse.dialects import tl

Value = SSAValue | int | float | bool
"""An operand: an SSA value, or a Python number that becomes a `tl.constant`."""


def pow2(n: int, lo: int = 16) -> int:
    """The smallest power of two that is at least `n` and `lo` (tile sizes are powers of two)."""
    p = lo
    while p < n:
        p *= 2
    return p


@dataclass
class Params:
    """A kernel's parameters: block arguments with the host expressions bound to them."""

    block: Block = field(default_factory=Block)
    host: list[str] = field(default_factory=list)
    """The launcher's expression for each argument, in order."""
    constexprs: list[int] = field(default_factory=list)
    """The indices of the `tl.constexpr` arguments."""
    by_key: dict[str, SSAValue] = field(default_factory=dict)

    def param(self, key: str, type: Attribute, host: str, constexpr: bool = False) -> SSAValue:
        """The argument named `key`, added (bound to `host`) on first use."""
        if key not in self.by_key:
            arg = self.block.insert_arg(type, len(self.block.args))
            arg.name_hint = key
            self.host.append(host)
            if constexpr:
                self.constexprs.append(len(self.block.args) - 1)
            self.by_key[key] = arg
        return self.by_key[key]


@dataclass
class TensorParam:
    """A tensor argument of a kernel: its pointer, one stride per dimension and, when the
    kernel masks loads to the tensor's bounds, one size per dimension."""

    ptr: SSAValue
    strides: list[SSAValue]
    sizes: list[SSAValue] = field(default_factory=list)


class KernelBuilder:
    """Appends tl ops to a block; parameters are added to the kernel as they are needed."""

    def __init__(self, params: Params, block: Block):
        self.params = params
        self.block = block

    def emit(self, op: Operation, hint: str | None = None) -> SSAValue:
        """Append `op`, which has one result, and return that result (named `hint`)."""
        self.block.add_op(op)
        (result,) = op.results
        if hint:
            result.name_hint = hint
        return result

    def value(self, x: Value, like: Attribute | None = None) -> SSAValue:
        """`x` as an SSA value: a number becomes a constant, a float one when `x` is a float
        or `like` (the type of the other operand) is not an integer type."""
        if isinstance(x, SSAValue):
            return x
        if isinstance(x, float) or (like is not None and not isinstance(tl.scalar_of(like), IntegerType)):
            return self.emit(tl.ConstantOp(float(x), f32))
        return self.emit(tl.ConstantOp(x))

    def binary(self, cls: type[tl.BinaryOp], a: Value, b: Value, hint: str | None = None) -> SSAValue:
        a_v = self.value(a, b.type if isinstance(b, SSAValue) else None)
        b_v = self.value(b, a_v.type)
        return self.emit(cls(a_v, b_v), hint)

    def add(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.AddOp, a, b, hint)

    def sub(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.SubOp, a, b, hint)

    def mul(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.MulOp, a, b, hint)

    def div(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.TrueDivOp, a, b, hint)

    def floordiv(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.FloorDivOp, a, b, hint)

    def rem(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.RemOp, a, b, hint)

    def and_(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.AndOp, a, b, hint)

    def or_(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.OrOp, a, b, hint)

    def xor(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.XorOp, a, b, hint)

    def maximum(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.MaximumOp, a, b, hint)

    def minimum(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.MinimumOp, a, b, hint)

    def cdiv(self, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        return self.binary(tl.CdivOp, a, b, hint)

    def cmp(self, pred: str, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        """`a pred b`, pred one of tl.CmpOp's Python operators (`<`, `==`, ...)."""
        a_v = self.value(a, b.type if isinstance(b, SSAValue) else None)
        return self.emit(tl.CmpOp(pred, a_v, self.value(b, a_v.type)), hint)

    def where(self, c: SSAValue, a: Value, b: Value, hint: str | None = None) -> SSAValue:
        like = a.type if isinstance(a, SSAValue) else b.type if isinstance(b, SSAValue) else None
        return self.emit(tl.WhereOp(c, self.value(a, like), self.value(b, like)), hint)

    def unary(self, cls: type[tl.UnaryOp], x: SSAValue, hint: str | None = None) -> SSAValue:
        return self.emit(cls(x), hint)

    def cast(self, x: SSAValue, element: Attribute, hint: str | None = None) -> SSAValue:
        """`x` with element type `element` (`x` itself if it has it already)."""
        if tl.scalar_of(x.type) == element:
            return x
        return self.emit(tl.CastOp(x, element), hint)

    def arange(self, end: Value, hint: str | None = None) -> SSAValue:
        return self.emit(tl.ArangeOp(self.value(end)), hint)

    def full(self, dims: Sequence[Value], value: float, element: Attribute, hint: str | None = None) -> SSAValue:
        return self.emit(tl.FullOp([self.value(d) for d in dims], value, element), hint)

    def row(self, x: SSAValue) -> SSAValue:
        """x[:, None]"""
        return self.emit(tl.ExpandDimsOp(x, 1))

    def col(self, x: SSAValue) -> SSAValue:
        """x[None, :]"""
        return self.emit(tl.ExpandDimsOp(x, 0))

    def reduce(self, kind: str, x: SSAValue, axis: int, hint: str | None = None) -> SSAValue:
        return self.emit(tl.ReduceOp(kind, x, axis), hint)

    def load(
        self, ptr: SSAValue, mask: SSAValue | None = None, other: float | None = None, hint: str | None = None
    ) -> SSAValue:
        """Load from `ptr`; where `mask` is false, `other` (ignored without a mask)."""
        return self.emit(tl.LoadOp(ptr, mask, other if mask is not None else None), hint)

    def store(self, ptr: SSAValue, value: SSAValue, mask: SSAValue | None = None) -> None:
        self.block.add_op(tl.StoreOp(ptr, value, mask))

    def dot(
        self,
        a: SSAValue,
        b: SSAValue,
        acc: SSAValue | None = None,
        precision: str | None = None,
        hint: str | None = None,
    ) -> SSAValue:
        return self.emit(tl.DotOp(a, b, acc, precision), hint)

    def loop(
        self,
        lb: Value,
        ub: Value,
        step: Value,
        carried: dict[str, SSAValue],
        body: Callable[[KernelBuilder, SSAValue, dict[str, SSAValue]], dict[str, SSAValue]],
        iv_name: str = "start_n",
    ) -> dict[str, SSAValue]:
        """`for iv in range(lb, ub, step)` carrying `carried` (by name): `body(builder, iv,
        carried values)` builds one iteration and returns the next values; the loop's
        results are returned by name."""
        names = list(carried)
        block = Block(arg_types=[i32, *(carried[n].type for n in names)])
        block.args[0].name_hint = iv_name
        for arg, n in zip(block.args[1:], names, strict=True):
            arg.name_hint = n
        inner = KernelBuilder(self.params, block)
        new = body(inner, block.args[0], dict(zip(names, block.args[1:], strict=True)))
        block.add_op(tl.YieldOp(*(new[n] for n in names)))
        op = tl.ForOp(self.value(lb), self.value(ub), self.value(step), [carried[n] for n in names], block)
        self.block.add_op(op)
        for r, n in zip(op.res, names, strict=True):
            r.name_hint = n
        return dict(zip(names, op.res, strict=True))
