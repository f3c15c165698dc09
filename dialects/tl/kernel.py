"""The `tl` ops that give a kernel its shape: `tl.kernel` and `tl.return`, the `tl.for` loop and its
`tl.yield`, the grid queries (`tl.program_id`, `tl.num_programs`), and memory (`tl.load`, `tl.store`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from xdsl.dialects.builtin import (
    I64,
    AnyFloat,
    ArrayAttr,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    i32,
    i64,
)
from xdsl.ir import (
    Attribute,
    Block,
    Operation,
    Region,
    SSAValue,
)
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    ParsePropInAttrDict,
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
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tl.types import PointerType, TileType, is_tile, scalar_of

# --------------------------------------------------------------------------- kernels


def _print_function(printer: Printer, op: KernelOp | DeviceFnOp, constexprs: set[int]) -> None:
    """` @name(%a: T, %b: T constexpr, ...) attributes {...} { body }`: a kernel or device function."""
    printer.print_string(f" @{op.sym_name.data}(")
    for i, arg in enumerate(op.body.block.args):
        if i:
            printer.print_string(", ")
        printer.print_block_argument(arg)
        if i in constexprs:
            printer.print_string(" constexpr")
    printer.print_string(")")
    printer.print_op_attributes(op.attributes, print_keyword=True)
    printer.print_string(" ")
    printer.print_region(op.body, print_entry_block_args=False)


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
        _print_function(printer, self, {c.data for c in self.constexprs})

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
    """End of a kernel body (no values) or of a device function's (the values it returns)."""

    name = "tl.return"
    values = var_operand_def()
    traits = traits_def(IsTerminator())
    assembly_format = "($values^ `:` type($values))? attr-dict"

    def __init__(self, *values: SSAValue):
        super().__init__(operands=[list(values)])

    def verify_(self) -> None:
        parent = self.parent_op()
        if isinstance(parent, KernelOp) and self.values:
            raise VerifyException("tl.return in a tl.kernel returns no values")
        if not isinstance(parent, KernelOp | DeviceFnOp):
            raise VerifyException("tl.return must be in a tl.kernel or tl.device_fn")


@irdl_op_definition
class DeviceFnOp(IRDLOperation):
    """A `@triton.jit` device function that kernels call (the sm90 Gluon kernel takes the
    variant's KV range and score ops as such functions). Block arguments are its parameters;
    its `tl.return` gives its results."""

    name = "tl.device_fn"
    sym_name = prop_def(StringAttr)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), SymbolOpInterface())

    def __init__(self, name: str, block: Block):
        super().__init__(properties={"sym_name": StringAttr(name)}, regions=[Region(block)])

    def print(self, printer: Printer) -> None:
        _print_function(printer, self, set())

    @classmethod
    def parse(cls, parser: Parser) -> DeviceFnOp:
        name = parser.parse_symbol_name().data
        args = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_argument)
        attrs = parser.parse_optional_attr_dict_with_keyword()
        region = parser.parse_region(args)
        return cls.create(
            properties={"sym_name": StringAttr(name)}, attributes=attrs.data if attrs else {}, regions=[region]
        )

    def verify_(self) -> None:
        if not isinstance(self.body.block.last_op, ReturnOp) or not self.body.block.last_op.values:
            raise VerifyException("tl.device_fn body must end with a tl.return of its results")


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
                else FloatAttr(float(other), cast(AnyFloat, element))
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
