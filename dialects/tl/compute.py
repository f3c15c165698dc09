"""The `tl` ops that compute values: literals and filled tiles, elementwise arithmetic and
comparisons, casts, reductions, selection, and the matmul `tl.dot`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, cast

from xdsl.dialects.builtin import (
    I64,
    AnyFloat,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f32,
    i1,
    i32,
    i64,
)
from xdsl.dialects.utils.enum_attribute import EnumAttribute
from xdsl.ir import (
    Attribute,
    Operation,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
)
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from attnfuse.dialects.tl.types import TileType, broadcast_type, is_tile, promote, scalar_of


@irdl_op_definition
class ConstantOp(IRDLOperation):
    """A scalar literal (printed inline)."""

    name = "tl.constant"
    value = prop_def(AnyAttr())
    result = result_def()

    def __init__(self, value: int | float | bool, type: Attribute | None = None):
        if isinstance(value, bool):
            attr = IntegerAttr(int(value), i1)
        elif isinstance(value, int):
            attr = IntegerAttr(value, cast(IntegerType, type or i32))
        else:
            attr = FloatAttr(float(value), cast(AnyFloat, type or f32))
        super().__init__(properties={"value": attr}, result_types=[attr.type])

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_attribute(self.value)
        printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser) -> ConstantOp:
        value = parser.parse_attribute()
        if not isinstance(value, IntegerAttr | FloatAttr):
            parser.raise_error("tl.constant needs a typed integer or float literal, e.g. `0 : i32`")
        attrs = parser.parse_optional_attr_dict()
        return cls.create(properties={"value": value}, attributes=attrs, result_types=[value.type])

    def verify_(self) -> None:
        if not isinstance(self.value, IntegerAttr | FloatAttr) or self.value.type != self.result.type:
            raise VerifyException("tl.constant value must be a literal of the result type")

    @property
    def literal(self) -> int | float | bool:
        v = self.value
        assert isinstance(v, IntegerAttr | FloatAttr)
        if isinstance(v, IntegerAttr) and v.type == i1:
            return bool(v.value.data)
        return v.value.data


@irdl_op_definition
class ArangeOp(IRDLOperation):
    """`tl.arange(0, end)` with a constexpr `end`."""

    name = "tl.arange"
    end = operand_def(IntegerType)
    result = result_def(TileType)
    assembly_format = "$end attr-dict `:` type($end) `->` type($result)"

    def __init__(self, end: SSAValue | Operation):
        super().__init__(operands=[end], result_types=[TileType(i32)])


@irdl_op_definition
class FullOp(IRDLOperation):
    """`tl.full([dims...], value, dtype)`: a tile filled with one value."""

    name = "tl.full"
    dims = var_operand_def(i32)
    value = prop_def(AnyAttr())
    result = result_def(TileType)
    assembly_format = "$dims `value` `=` $value attr-dict `->` type($result)"

    def __init__(self, dims: Sequence[SSAValue | Operation], value: float | int, element: Attribute):
        attr = (
            IntegerAttr(int(value), element)
            if isinstance(element, IntegerType)
            else FloatAttr(float(value), cast(AnyFloat, element))
        )
        super().__init__(operands=[dims], properties={"value": attr}, result_types=[TileType(element)])


class BinaryOp(IRDLOperation):
    """Base of elementwise binary ops printed as a Python operator or `tl.fn(a, b)`."""

    SYMBOL: ClassVar[str] = ""
    FUNCTION: ClassVar[str] = ""
    lhs = operand_def()
    rhs = operand_def()
    result = result_def()
    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"

    def __init__(self, lhs: SSAValue | Operation, rhs: SSAValue | Operation, result_type: Attribute | None = None):
        lhs, rhs = SSAValue.get(lhs), SSAValue.get(rhs)
        super().__init__(operands=[lhs, rhs], result_types=[result_type or broadcast_type(lhs.type, rhs.type)])

    def verify_(self) -> None:
        expected = broadcast_type(self.lhs.type, self.rhs.type)
        if self.result.type != expected:
            raise VerifyException(
                f"{self.name} of {self.lhs.type} and {self.rhs.type} gives {expected}, not {self.result.type}"
            )


@irdl_op_definition
class AddOp(BinaryOp):
    """`a + b` (also pointer + offset)."""

    name = "tl.add"
    SYMBOL: ClassVar[str] = "+"


@irdl_op_definition
class SubOp(BinaryOp):
    """`a - b`."""

    name = "tl.sub"
    SYMBOL: ClassVar[str] = "-"


@irdl_op_definition
class MulOp(BinaryOp):
    """`a * b`."""

    name = "tl.mul"
    SYMBOL: ClassVar[str] = "*"


@irdl_op_definition
class TrueDivOp(BinaryOp):
    """`a / b` (floats)."""

    name = "tl.truediv"
    SYMBOL: ClassVar[str] = "/"


@irdl_op_definition
class FloorDivOp(BinaryOp):
    """`a // b`: on integers Triton truncates toward zero (C semantics)."""

    name = "tl.floordiv"
    SYMBOL: ClassVar[str] = "//"


@irdl_op_definition
class RemOp(BinaryOp):
    """`a % b`: on integers the sign follows the dividend (C semantics)."""

    name = "tl.rem"
    SYMBOL: ClassVar[str] = "%"


@irdl_op_definition
class AndOp(BinaryOp):
    """`a & b`."""

    name = "tl.and"
    SYMBOL: ClassVar[str] = "&"


@irdl_op_definition
class OrOp(BinaryOp):
    """`a | b`."""

    name = "tl.or"
    SYMBOL: ClassVar[str] = "|"


@irdl_op_definition
class XorOp(BinaryOp):
    """`a ^ b`."""

    name = "tl.xor"
    SYMBOL: ClassVar[str] = "^"


@irdl_op_definition
class MaximumOp(BinaryOp):
    """`tl.maximum(a, b)`."""

    name = "tl.maximum"
    FUNCTION: ClassVar[str] = "tl.maximum"


@irdl_op_definition
class MinimumOp(BinaryOp):
    """`tl.minimum(a, b)`."""

    name = "tl.minimum"
    FUNCTION: ClassVar[str] = "tl.minimum"


@irdl_op_definition
class CdivOp(BinaryOp):
    """`tl.cdiv(a, b)`: ceiling division of integers."""

    name = "tl.cdiv"
    FUNCTION: ClassVar[str] = "tl.cdiv"


class CmpPredicate(StrEnum):
    """The comparisons of `tl.cmp`, spelt as their Python operators."""

    LT = "<"
    LE = "<="
    EQ = "=="
    NE = "!="
    GT = ">"
    GE = ">="


@irdl_attr_definition
class CmpPredicateAttr(EnumAttribute[CmpPredicate], SpacedOpaqueSyntaxAttribute):
    """`tl.cmp`'s predicate: `"<"` in the op, `#tl<cmp_predicate "<">` on its own."""

    name = "tl.cmp_predicate"


@irdl_op_definition
class CmpOp(IRDLOperation):
    """`a <pred> b` with pred one of < <= == != > >=; the result is boolean."""

    name = "tl.cmp"
    predicate = prop_def(CmpPredicateAttr)
    lhs = operand_def()
    rhs = operand_def()
    result = result_def()
    assembly_format = "$predicate $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"

    def __init__(self, predicate: str, lhs: SSAValue | Operation, rhs: SSAValue | Operation):
        lhs, rhs = SSAValue.get(lhs), SSAValue.get(rhs)
        super().__init__(
            operands=[lhs, rhs],
            properties={"predicate": CmpPredicateAttr(CmpPredicate(predicate))},
            result_types=[broadcast_type(lhs.type, rhs.type, i1)],
        )


class UnaryOp(IRDLOperation):
    """Base of elementwise unary ops printed as `fn(x)` or a prefix operator."""

    FUNCTION: ClassVar[str] = ""
    PREFIX: ClassVar[str] = ""
    T: ClassVar = VarConstraint("T", AnyAttr())
    input = operand_def(T)
    result = result_def(T)
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation):
        input = SSAValue.get(input)
        super().__init__(operands=[input], result_types=[input.type])


@irdl_op_definition
class NegOp(UnaryOp):
    """`-x`."""

    name = "tl.neg"
    PREFIX: ClassVar[str] = "-"


@irdl_op_definition
class NotOp(UnaryOp):
    """`~x` (bitwise / logical not)."""

    name = "tl.not"
    PREFIX: ClassVar[str] = "~"


@irdl_op_definition
class Exp2Op(UnaryOp):
    """`tl.exp2(x)`."""

    name = "tl.exp2"
    FUNCTION: ClassVar[str] = "tl.exp2"


@irdl_op_definition
class Log2Op(UnaryOp):
    """`tl.log2(x)`."""

    name = "tl.log2"
    FUNCTION: ClassVar[str] = "tl.log2"


@irdl_op_definition
class ExpOp(UnaryOp):
    """`tl.exp(x)`."""

    name = "tl.exp"
    FUNCTION: ClassVar[str] = "tl.exp"


@irdl_op_definition
class LogOp(UnaryOp):
    """`tl.log(x)`."""

    name = "tl.log"
    FUNCTION: ClassVar[str] = "tl.log"


@irdl_op_definition
class SqrtOp(UnaryOp):
    """`tl.sqrt(x)`."""

    name = "tl.sqrt"
    FUNCTION: ClassVar[str] = "tl.sqrt"


@irdl_op_definition
class RsqrtOp(UnaryOp):
    """`tl.rsqrt(x)`."""

    name = "tl.rsqrt"
    FUNCTION: ClassVar[str] = "tl.rsqrt"


@irdl_op_definition
class CosOp(UnaryOp):
    """`tl.cos(x)`."""

    name = "tl.cos"
    FUNCTION: ClassVar[str] = "tl.cos"


@irdl_op_definition
class SinOp(UnaryOp):
    """`tl.sin(x)`."""

    name = "tl.sin"
    FUNCTION: ClassVar[str] = "tl.sin"


@irdl_op_definition
class AbsOp(UnaryOp):
    """`tl.abs(x)`."""

    name = "tl.abs"
    FUNCTION: ClassVar[str] = "tl.abs"


@irdl_op_definition
class SigmoidOp(UnaryOp):
    """`tl.sigmoid(x)`."""

    name = "tl.sigmoid"
    FUNCTION: ClassVar[str] = "tl.sigmoid"


@irdl_op_definition
class FastTanhOp(UnaryOp):
    """`_fast_tanh(x)`: tanh by the GPU's approximate instruction (`tanh.approx.f32`, relative
    error about 2^-11), where kernel-path chose it (`tanh = "approx"` or `"approx-gluon"`). It is
    inline PTX, which the Triton interpreter cannot run; the printer defines `_fast_tanh` in
    modules that use it."""

    name = "tl.fast_tanh"
    FUNCTION: ClassVar[str] = "_fast_tanh"


@irdl_op_definition
class CastOp(IRDLOperation):
    """`x.to(dtype)`: convert to the result's element type."""

    name = "tl.cast"
    input = operand_def()
    result = result_def()
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation, element: Attribute):
        input = SSAValue.get(input)
        super().__init__(
            operands=[input],
            result_types=[TileType(element) if is_tile(input.type) else element],
        )


@irdl_op_definition
class ExpandDimsOp(IRDLOperation):
    """`x[:, None]` (axis 1) or `x[None, :]` (axis 0) of a 1-D tile."""

    name = "tl.expand_dims"
    T: ClassVar = VarConstraint("T", base(TileType))
    input = operand_def(T)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(T)
    assembly_format = "$input `axis` $axis attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation, axis: int):
        input = SSAValue.get(input)
        super().__init__(operands=[input], properties={"axis": IntegerAttr(axis, i64)}, result_types=[input.type])

    def verify_(self) -> None:
        if self.axis.value.data not in (0, 1):
            raise VerifyException("tl.expand_dims axis must be 0 or 1")


class ReduceKind(StrEnum):
    """The reductions of `tl.reduce`, named as their `triton.language` functions."""

    MAX = "max"
    SUM = "sum"


@irdl_attr_definition
class ReduceKindAttr(EnumAttribute[ReduceKind], SpacedOpaqueSyntaxAttribute):
    """`tl.reduce`'s kind: `max` in the op, `#tl<reduce_kind max>` on its own."""

    name = "tl.reduce_kind"


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """`tl.max(x, axis)` or `tl.sum(x, axis)`."""

    name = "tl.reduce"
    kind = prop_def(ReduceKindAttr)
    T: ClassVar = VarConstraint("T", base(TileType))
    input = operand_def(T)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(T)
    assembly_format = "$kind $input `axis` $axis attr-dict `:` type($input)"

    def __init__(self, kind: str, input: SSAValue | Operation, axis: int):
        input = SSAValue.get(input)
        super().__init__(
            operands=[input],
            properties={"kind": ReduceKindAttr(ReduceKind(kind)), "axis": IntegerAttr(axis, i64)},
            result_types=[input.type],
        )


@irdl_op_definition
class WhereOp(IRDLOperation):
    """`tl.where(cond, a, b)`."""

    name = "tl.where"
    cond = operand_def()
    lhs = operand_def()
    rhs = operand_def()
    result = result_def()
    assembly_format = (
        "$cond `,` $lhs `,` $rhs attr-dict `:` type($cond) `,` type($lhs) `,` type($rhs) `->` type($result)"
    )

    def __init__(self, cond: SSAValue | Operation, lhs: SSAValue | Operation, rhs: SSAValue | Operation):
        cond, lhs, rhs = SSAValue.get(cond), SSAValue.get(lhs), SSAValue.get(rhs)
        t = broadcast_type(
            broadcast_type(lhs.type, rhs.type), cond.type, promote(scalar_of(lhs.type), scalar_of(rhs.type))
        )
        super().__init__(operands=[cond, lhs, rhs], result_types=[t])


@irdl_op_definition
class DotOp(IRDLOperation):
    """`tl.dot(a, b, acc)`: a [M, K] times b [K, N], accumulated in fp32."""

    name = "tl.dot"
    lhs = operand_def(TileType)
    rhs = operand_def(TileType)
    acc = opt_operand_def(TileType)
    input_precision = opt_prop_def(StringAttr)
    result = result_def(TileType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$lhs `,` $rhs (`acc` $acc^ `:` type($acc))? attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"
    )

    def __init__(
        self,
        lhs: SSAValue | Operation,
        rhs: SSAValue | Operation,
        acc: SSAValue | Operation | None = None,
        input_precision: str | None = None,
    ):
        props = {} if input_precision is None else {"input_precision": StringAttr(input_precision)}
        super().__init__(
            operands=[lhs, rhs, [] if acc is None else [acc]],
            properties=props,
            result_types=[TileType(f32)],
        )


@irdl_op_definition
class TransOp(IRDLOperation):
    """`tl.trans(x)`."""

    name = "tl.trans"
    T: ClassVar = VarConstraint("T", base(TileType))
    input = operand_def(T)
    result = result_def(T)
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation):
        input = SSAValue.get(input)
        super().__init__(operands=[input], result_types=[input.type])


@irdl_op_definition
class GatherOp(IRDLOperation):
    """`tl.gather(x, index, axis)`: out[i][j] = x[i][index[i][j]] along `axis` (1) or
    x[index[i][j]][j] (0); `index` has x's shape."""

    name = "tl.gather"
    T: ClassVar = VarConstraint("T", base(TileType))
    input = operand_def(T)
    index = operand_def(TileType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(T)
    assembly_format = "$input `[` $index `]` `axis` $axis attr-dict `:` type($input) `,` type($index)"

    def __init__(self, input: SSAValue | Operation, index: SSAValue | Operation, axis: int):
        input = SSAValue.get(input)
        super().__init__(
            operands=[input, index], properties={"axis": IntegerAttr(axis, i64)}, result_types=[input.type]
        )

    def verify_(self) -> None:
        if self.axis.value.data not in (0, 1):
            raise VerifyException(f"tl.gather axis must be 0 or 1, got {self.axis.value.data}")
        if not isinstance(scalar_of(self.index.type), IntegerType):
            raise VerifyException(f"tl.gather index must be an integer tile, got {self.index.type}")
