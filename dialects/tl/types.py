"""The `tl` dialect's types (`!tl.tile<T>`, `!tl.ptr<T>`), the typing rule of its elementwise ops,
and the names of the Python modules it prints to."""

from __future__ import annotations

import builtins
import keyword
from collections.abc import Sequence

from xdsl.dialects.builtin import (
    BFloat16Type,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
)
from xdsl.ir import (
    Attribute,
    ParametrizedAttribute,
    TypeAttribute,
)
from xdsl.irdl import (
    irdl_attr_definition,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException

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
        element = ea if isinstance(ea, PointerType) or ea == eb else promote(ea, eb)
    return TileType(element) if is_tile(a) or is_tile(b) else element


def promote(a: Attribute, b: Attribute) -> Attribute:
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


# Names of the generated Python module, shared by the lowering (launcher parameters) and the
# printer (kernel values).

RESERVED_NAMES = (
    set(keyword.kwlist)
    | set(dir(builtins))
    | {
        "tl",
        "triton",
        "torch",
        "operator",
        "range",
        "float",
        "int",
        "launch",
        "_launch",
        "_rope_table",
        "_TABLES",
        "_BINARIES",
        "_DRIVER",
        "_PLANS",
        "_plan",
    }
)
"""Names a generated module uses itself (keywords, builtins, imports, its helpers): kernel
values and launcher parameters must not take them."""


def dtype_name(t: Attribute, prefix: str = "tl") -> str:
    """`tl.float16` etc. for a scalar type (`torch.` names with prefix "torch")."""
    if isinstance(t, Float8E4M3FNType):
        return "torch.float8_e4m3fn" if prefix == "torch" else f"{prefix}.float8e4nv"
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
