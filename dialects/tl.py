"""The `tl` dialect: a Triton-emitting IR whose ops mirror `triton.language`.

Device ops live in `tl.kernel` (one `@triton.jit` function) and map one-to-one to
Python expressions (`tl.dot` -> `tl.dot(a, b, acc)`, `tl.add` -> `a + b`, `tl.for`
-> a `for` loop with loop-carried variables). Host ops live in `tl.launcher` (the
plain-Python `launch(...)` function that allocates outputs and launches kernels);
their string operands are host Python expressions over the launcher's parameters.

Types: `!tl.tile<T>` is a block of T (shape implicit, as in Triton source);
`!tl.ptr<T>` a pointer; scalars are builtin integers and floats.
"""

from __future__ import annotations

import builtins
import keyword
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntAttr,
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
    Block,
    Dialect,
    Operation,
    ParametrizedAttribute,
    Region,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, NoTerminator, SymbolOpInterface
from xdsl.utils.exceptions import DiagnosticException, VerifyException
from xdsl.utils.str_enum import StrEnum

# --------------------------------------------------------------------------- types


class _OfType(ParametrizedAttribute, TypeAttribute):
    """Base of the types parametrised by one element type, written `!tl.x<T>`."""

    def __init__(self, element: Attribute):
        super().__init__(element)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            return (parser.parse_type(),)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_attribute(self.parameters[0])


@irdl_attr_definition
class TileType(_OfType):
    """A block of values of one element type (`tl.tensor` in Triton)."""

    name = "tl.tile"
    element_type: Attribute


@irdl_attr_definition
class PointerType(_OfType):
    """A pointer to global memory holding elements of `pointee` (`tl.pointer_type`)."""

    name = "tl.ptr"
    pointee: Attribute


def scalar_of(t: Attribute) -> Attribute:
    """The element type of a tile, or the type itself for scalars and pointers."""
    return t.element_type if isinstance(t, TileType) else t


def is_tile(t: Attribute) -> bool:
    return isinstance(t, TileType)


def broadcast_type(a: Attribute, b: Attribute, element: Attribute | None = None) -> Attribute:
    """Result type of an elementwise op on `a` and `b`: a tile if either is one."""
    if element is None:
        ea, eb = scalar_of(a), scalar_of(b)
        element = ea if isinstance(ea, PointerType) or ea == eb else _promote(ea, eb)
    return TileType(element) if is_tile(a) or is_tile(b) else element


def _promote(a: Attribute, b: Attribute) -> Attribute:
    if isinstance(a, PointerType):
        return a
    if isinstance(b, PointerType):
        return b
    a_int, b_int = isinstance(a, IntegerType), isinstance(b, IntegerType)
    if a_int and not b_int:
        return b
    if b_int and not a_int:
        return a
    return a


# --------------------------------------------------------------------------- kernels


@irdl_op_definition
class KernelOp(IRDLOperation):
    """One `@triton.jit` kernel. Block arguments are its parameters, in order;
    `constexprs` names the positions of `tl.constexpr` parameters."""

    name = "tl.kernel"
    sym_name = prop_def(StringAttr)
    constexprs = prop_def(ArrayAttr[IntAttr])
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), SymbolOpInterface())

    def __init__(
        self, name: str, arg_types: Sequence[Attribute], arg_names: Sequence[str], constexprs: Sequence[int] = ()
    ):
        block = Block(arg_types=arg_types)
        for arg, n in zip(block.args, arg_names, strict=True):
            arg.name_hint = n
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "constexprs": ArrayAttr(IntAttr(i) for i in constexprs),
            },
            regions=[Region(block)],
        )

    def print(self, printer: Printer) -> None:
        printer.print_string(f" @{self.sym_name.data}(")
        cx = {c.data for c in self.constexprs}
        for i, arg in enumerate(self.body.block.args):
            if i:
                printer.print_string(", ")
            printer.print_block_argument(arg)
            if i in cx:
                printer.print_string(" constexpr")
        printer.print_string(")")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> KernelOp:
        name = parser.parse_symbol_name().data
        args = []
        constexprs: list[int] = []

        def parse_arg() -> None:
            args.append(parser.parse_argument())
            if parser.parse_optional_keyword("constexpr") is not None:
                constexprs.append(len(args) - 1)

        parser.parse_comma_separated_list(parser.Delimiter.PAREN, parse_arg)
        attrs = parser.parse_optional_attr_dict_with_keyword()
        region = parser.parse_region(args)
        op = cls.create(
            properties={
                "sym_name": StringAttr(name),
                "constexprs": ArrayAttr(IntAttr(i) for i in constexprs),
            },
            attributes=attrs.data if attrs else {},
            regions=[region],
        )
        return op

    def verify_(self) -> None:
        n = len(self.body.block.args)
        for c in self.constexprs:
            if not 0 <= c.data < n:
                raise VerifyException(f"tl.kernel constexpr index {c.data} out of range")
        if not isinstance(self.body.block.last_op, ReturnOp):
            raise VerifyException("tl.kernel body must end with tl.return")


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """End of a kernel body."""

    name = "tl.return"
    traits = traits_def(IsTerminator(), HasParent(KernelOp))
    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__()


# --------------------------------------------------------------------------- device ops


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
            attr = IntegerAttr(value, type or i32)
        else:
            attr = FloatAttr(float(value), type or f32)
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


class _AxisOp(IRDLOperation):
    """Base of the grid queries: one i32 per program along `axis`."""

    axis = prop_def(IntegerAttr[I64])
    result = result_def(i32)
    assembly_format = "$axis attr-dict `:` type($result)"

    def __init__(self, axis: int):
        super().__init__(properties={"axis": IntegerAttr(axis, i64)}, result_types=[i32])


@irdl_op_definition
class ProgramIdOp(_AxisOp):
    """`tl.program_id(axis)`: this program's index along `axis` of the grid."""

    name = "tl.program_id"


@irdl_op_definition
class NumProgramsOp(_AxisOp):
    """`tl.num_programs(axis)`: the grid's size along `axis`."""

    name = "tl.num_programs"


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
            IntegerAttr(int(value), element) if isinstance(element, IntegerType) else FloatAttr(float(value), element)
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
    input = operand_def()
    result = result_def()
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

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
    input = operand_def(TileType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TileType)
    assembly_format = "$input `axis` $axis attr-dict `:` type($input) `->` type($result)"

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
    input = operand_def(TileType)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TileType)
    assembly_format = "$kind $input `axis` $axis attr-dict `:` type($input) `->` type($result)"

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
            broadcast_type(lhs.type, rhs.type), cond.type, _promote(scalar_of(lhs.type), scalar_of(rhs.type))
        )
        super().__init__(operands=[cond, lhs, rhs], result_types=[t])


@irdl_op_definition
class LoadOp(IRDLOperation):
    """`tl.load(ptr, mask=mask, other=other)`."""

    name = "tl.load"
    ptr = operand_def()
    mask = opt_operand_def()
    other = opt_prop_def(AnyAttr())
    result = result_def()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$ptr (`mask` $mask^ `:` type($mask))? attr-dict `:` type($ptr) `->` type($result)"

    def __init__(self, ptr: SSAValue | Operation, mask: SSAValue | Operation | None = None, other: float | None = None):
        ptr = SSAValue.get(ptr)
        pointee = scalar_of(ptr.type)
        if not isinstance(pointee, PointerType):
            raise VerifyException(f"tl.load needs pointers, got {ptr.type}")
        element = pointee.pointee
        props = {}
        if other is not None:
            props["other"] = (
                IntegerAttr(int(other), element)
                if isinstance(element, IntegerType)
                else FloatAttr(float(other), element)
            )
        t = (
            TileType(element)
            if is_tile(ptr.type) or (mask is not None and is_tile(SSAValue.get(mask).type))
            else element
        )
        super().__init__(operands=[ptr, [] if mask is None else [mask]], properties=props, result_types=[t])

    def verify_(self) -> None:
        pointee = scalar_of(self.ptr.type)
        if not isinstance(pointee, PointerType):
            raise VerifyException(f"tl.load needs a pointer or a tile of pointers, got {self.ptr.type}")
        if scalar_of(self.result.type) != pointee.pointee:
            raise VerifyException(f"tl.load result must hold {pointee.pointee}, got {self.result.type}")


@irdl_op_definition
class StoreOp(IRDLOperation):
    """`tl.store(ptr, value, mask=mask)`."""

    name = "tl.store"
    ptr = operand_def()
    value = operand_def()
    mask = opt_operand_def()
    assembly_format = "$value `,` $ptr (`mask` $mask^ `:` type($mask))? attr-dict `:` type($value) `,` type($ptr)"

    def __init__(
        self, ptr: SSAValue | Operation, value: SSAValue | Operation, mask: SSAValue | Operation | None = None
    ):
        super().__init__(operands=[ptr, value, [] if mask is None else [mask]])

    def verify_(self) -> None:
        pointee = scalar_of(self.ptr.type)
        if not isinstance(pointee, PointerType):
            raise VerifyException(f"tl.store needs a pointer or a tile of pointers, got {self.ptr.type}")
        if scalar_of(self.value.type) != pointee.pointee:
            raise VerifyException(f"tl.store value must hold {pointee.pointee} (the pointee), got {self.value.type}")


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
    input = operand_def(TileType)
    result = result_def(TileType)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation):
        input = SSAValue.get(input)
        super().__init__(operands=[input], result_types=[input.type])


@irdl_op_definition
class ForOp(IRDLOperation):
    """`for iv in range(lb, ub, step):` with loop-carried values.

    The body block takes (iv, *carried) and ends with `tl.yield` of the new carried
    values; the results are the carried values after the last iteration."""

    name = "tl.for"
    lb = operand_def(IntegerType)
    ub = operand_def(IntegerType)
    step = operand_def(IntegerType)
    inits = var_operand_def()
    res = var_result_def()
    body = region_def("single_block")

    def __init__(
        self,
        lb: SSAValue | Operation,
        ub: SSAValue | Operation,
        step: SSAValue | Operation,
        inits: Sequence[SSAValue | Operation],
        body: Block,
    ):
        inits = [SSAValue.get(i) for i in inits]
        super().__init__(
            operands=[lb, ub, step, inits],
            result_types=[[i.type for i in inits]],
            regions=[Region(body)],
        )

    def verify_(self) -> None:
        block = self.body.block
        if any(x.type != i32 for x in (self.lb, self.ub, self.step)):
            raise VerifyException("tl.for bounds and step must be i32")
        if len(block.args) != 1 + len(self.inits):
            raise VerifyException("tl.for body must take the induction variable and carried values")
        term = block.last_op
        if not isinstance(term, YieldOp) or len(term.operands) != len(self.inits):
            raise VerifyException("tl.for body must end with tl.yield of every carried value")

    def print(self, printer: Printer) -> None:
        block = self.body.block
        printer.print_string(" ")
        printer.print_block_argument(block.args[0], print_type=False)
        printer.print_string(" = ")
        printer.print_operand(self.lb)
        printer.print_string(" to ")
        printer.print_operand(self.ub)
        printer.print_string(" step ")
        printer.print_operand(self.step)
        if self.inits:
            printer.print_string(" iter_args(")
            for i, (arg, init) in enumerate(zip(block.args[1:], self.inits, strict=True)):
                if i:
                    printer.print_string(", ")
                printer.print_block_argument(arg, print_type=False)
                printer.print_string(" = ")
                printer.print_operand(init)
            printer.print_string(") -> (")
            printer.print_list([r.type for r in self.res], printer.print_attribute)
            printer.print_string(")")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> ForOp:
        iv = parser.parse_argument(expect_type=False)
        parser.parse_punctuation("=")
        lb = parser.resolve_operand(parser.parse_unresolved_operand(), i32)
        parser.parse_keyword("to")
        ub = parser.resolve_operand(parser.parse_unresolved_operand(), i32)
        parser.parse_keyword("step")
        step = parser.resolve_operand(parser.parse_unresolved_operand(), i32)
        carried = []
        unresolved = []
        inits = []
        if parser.parse_optional_keyword("iter_args") is not None:

            def parse_pair() -> None:
                carried.append(parser.parse_argument(expect_type=False))
                parser.parse_punctuation("=")
                unresolved.append(parser.parse_unresolved_operand())

            parser.parse_comma_separated_list(parser.Delimiter.PAREN, parse_pair)
            parser.parse_punctuation("->")
            types = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_type)
            carried = [a.resolve(t) for a, t in zip(carried, types, strict=True)]
            inits = [parser.resolve_operand(u, t) for u, t in zip(unresolved, types, strict=True)]
        iv = iv.resolve(i32)
        attrs = parser.parse_optional_attr_dict_with_keyword()
        region = parser.parse_region([iv, *carried])
        op = cls.create(
            operands=[lb, ub, step, *inits],
            result_types=[a.type for a in carried],
            regions=[region],
            attributes=attrs.data if attrs else {},
        )
        return op


@irdl_op_definition
class YieldOp(IRDLOperation):
    """End of a `tl.for` body: the next values of the carried variables."""

    name = "tl.yield"
    values = var_operand_def()
    traits = traits_def(IsTerminator(), HasParent(ForOp))
    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, *values: SSAValue | Operation):
        super().__init__(operands=[list(values)])


# --------------------------------------------------------------------------- host ops


@irdl_op_definition
class LauncherOp(IRDLOperation):
    """The host function `def <name>(<params>)` that allocates outputs and launches
    the kernels; `params` are the variant's tensor arguments in order."""

    name = "tl.launcher"
    sym_name = prop_def(StringAttr)
    params = prop_def(ArrayAttr[StringAttr])
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), IsolatedFromAbove())
    assembly_format = "$sym_name `(` $params `)` attr-dict-with-keyword $body"

    def __init__(self, name: str, params: Sequence[str], ops: Sequence[Operation]):
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "params": ArrayAttr(StringAttr(p) for p in params),
            },
            regions=[Region(Block(ops))],
        )


class _HostOp(IRDLOperation):
    traits = traits_def(HasParent(LauncherOp))


@irdl_op_definition
class AllocOp(_HostOp):
    """`name = torch.empty(shape, dtype=dtype, device=device)`; entries are host expressions."""

    name = "tl.alloc"
    var = prop_def(StringAttr)
    shape = prop_def(ArrayAttr[StringAttr])
    dtype = prop_def(StringAttr)
    device = prop_def(StringAttr)
    assembly_format = "$var `shape` $shape `dtype` $dtype `device` $device attr-dict"

    def __init__(self, var: str, shape: Sequence[str], dtype: str, device: str):
        super().__init__(
            properties={
                "var": StringAttr(var),
                "shape": ArrayAttr(StringAttr(s) for s in shape),
                "dtype": StringAttr(dtype),
                "device": StringAttr(device),
            }
        )


@irdl_op_definition
class RopeTableOp(_HostOp):
    """`cos, sin = _rope_table(key, inv_freq, length, magnitude, device)`: float32
    [positions, rotary_dim / 2] tables of magnitude * cos(pos * inv_freq) and
    magnitude * sin(...), built once per device and power-of-two length bucket."""

    name = "tl.rope_table"
    cos = prop_def(StringAttr)
    sin = prop_def(StringAttr)
    values = prop_def(ArrayAttr[FloatAttr])
    length = prop_def(StringAttr)
    magnitude = prop_def(FloatAttr[Float32Type])
    device = prop_def(StringAttr)
    assembly_format = (
        "$cos `,` $sin `inv_freq` $values `length` $length `magnitude` $magnitude `device` $device attr-dict"
    )

    def __init__(self, cos: str, sin: str, values: Sequence[float], length: str, magnitude: float, device: str):
        super().__init__(
            properties={
                "cos": StringAttr(cos),
                "sin": StringAttr(sin),
                "values": ArrayAttr(FloatAttr(float(v), f32) for v in values),
                "length": StringAttr(length),
                "magnitude": FloatAttr(float(magnitude), f32),
                "device": StringAttr(device),
            }
        )


@irdl_op_definition
class CallOp(_HostOp):
    """`kernel[grid](*args, num_warps=..., num_stages=...)`: one kernel launch.

    `grid` and `args` are host expressions; `args` match the kernel's parameters
    in order, constexpr parameters included."""

    name = "tl.call"
    callee = prop_def(StringAttr)
    grid = prop_def(ArrayAttr[StringAttr])
    args = prop_def(ArrayAttr[StringAttr])
    num_warps = prop_def(IntegerAttr[I64])
    num_stages = prop_def(IntegerAttr[I64])
    assembly_format = "$callee `grid` $grid `args` $args `num_warps` $num_warps `num_stages` $num_stages attr-dict"

    def __init__(self, callee: str, grid: Sequence[str], args: Sequence[str], num_warps: int, num_stages: int):
        super().__init__(
            properties={
                "callee": StringAttr(callee),
                "grid": ArrayAttr(StringAttr(g) for g in grid),
                "args": ArrayAttr(StringAttr(a) for a in args),
                "num_warps": IntegerAttr(num_warps, i64),
                "num_stages": IntegerAttr(num_stages, i64),
            }
        )


@irdl_op_definition
class HostReturnOp(_HostOp):
    """`return <values>` of the launcher (host expressions)."""

    name = "tl.host_return"
    values = prop_def(ArrayAttr[StringAttr])
    assembly_format = "$values attr-dict"

    def __init__(self, values: Sequence[str]):
        super().__init__(properties={"values": ArrayAttr(StringAttr(v) for v in values)})


UNARY_OPS = (NegOp, NotOp, Exp2Op, Log2Op, ExpOp, LogOp, SqrtOp, RsqrtOp, CosOp, SinOp, AbsOp, SigmoidOp)
BINARY_OPS = (AddOp, SubOp, MulOp, TrueDivOp, FloorDivOp, RemOp, AndOp, OrOp, XorOp, MaximumOp, MinimumOp, CdivOp)

TL = Dialect(
    "tl",
    [
        KernelOp,
        ReturnOp,
        ConstantOp,
        ProgramIdOp,
        NumProgramsOp,
        ArangeOp,
        FullOp,
        *BINARY_OPS,
        CmpOp,
        *UNARY_OPS,
        CastOp,
        ExpandDimsOp,
        ReduceOp,
        WhereOp,
        LoadOp,
        StoreOp,
        DotOp,
        TransOp,
        ForOp,
        YieldOp,
        LauncherOp,
        AllocOp,
        RopeTableOp,
        CallOp,
        HostReturnOp,
    ],
    [TileType, PointerType, CmpPredicateAttr, ReduceKindAttr],
)


# Names of the generated Python module, shared by the lowering (launcher parameters) and the
# printer (kernel values).

RESERVED_NAMES = (
    set(keyword.kwlist)
    | set(dir(builtins))
    | {
        "tl",
        "triton",
        "torch",
        "range",
        "float",
        "int",
        "launch",
        "_launch",
        "_rope_table",
        "_TABLES",
        "_BINARIES",
        "_DRIVER",
    }
)
"""Names a generated module uses itself (keywords, builtins, imports, its helpers): kernel
values and launcher parameters must not take them."""


def dtype_name(t: Attribute, prefix: str = "tl") -> str:
    """`tl.float16` etc. for a scalar type."""
    names = {
        Float16Type: "float16",
        BFloat16Type: "bfloat16",
        Float32Type: "float32",
        Float64Type: "float64",
    }
    for cls, n in names.items():
        if isinstance(t, cls):
            return f"{prefix}.{n}"
    if isinstance(t, IntegerType):
        width = t.width.data
        return f"{prefix}.int1" if width == 1 and prefix == "tl" else f"{prefix}.int{width}"
    raise DiagnosticException(f"no Triton dtype for {t}")
