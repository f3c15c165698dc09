"""The `attn` score modifiers that take a function of the positions: `attn.mask`,
`attn.bias` and `attn.score_mod`, in a named form (`causal`, `alibi(%slopes)`, ...) or
a `custom` one whose region computes the function with the ops of `REGION_OPS`; and
the region's own ops, `attn.extract` and `attn.yield`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from xdsl.dialects import arith
from xdsl.dialects import math as math_dialect
from xdsl.dialects.builtin import I64, IntegerAttr, IntegerType, StringAttr, TensorType, f32, i32, i64
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn.attributes import (
    BIAS_KINDS,
    INT32_MAX,
    MASK_KINDS,
    KvBoundAttr,
    NamedKind,
    ScoresType,
    check_annotation,
    heads_of,
    is_float,
)
from attnfuse.dialects.attn.ops import check_vector


def print_typed_operands(printer: Printer, values: Sequence[SSAValue]) -> None:
    """`(%a : type, %b : type)`; nothing for no values."""

    def typed_operand(value: SSAValue) -> None:
        printer.print_operand(value)
        printer.print_string(" : ")
        printer.print_attribute(value.type)

    if values:
        with printer.in_parens():
            printer.print_list(values, typed_operand)


def parse_typed_operands(parser: Parser) -> list[SSAValue]:
    """The rest of a `(%a : type, ...)` clause, after its `(`, up to and including its `)`."""

    def typed_operand() -> SSAValue:
        name = parser.parse_unresolved_operand()
        parser.parse_punctuation(":")
        return parser.resolve_operand(name, parser.parse_type())

    values = parser.parse_comma_separated_list(parser.Delimiter.NONE, typed_operand)
    parser.parse_punctuation(")")
    return values


class _ScoreFnOp(IRDLOperation):
    """Base of `attn.mask`, `attn.bias` and `attn.score_mod`.

    Syntax: `attn.mask %s <kind>[(<int>)][(%extra : type, ...)] [attributes {...}] [{ region }] : type`.
    A named kind (`causal`, `sliding_window(w)`, ...) has an empty region; the
    `custom` kind carries a region whose entry block takes ([score: f32,] b, h,
    q_idx, kv_idx: i32, then one argument per extra tensor) and yields the result.
    A region holds only the ops of `REGION_OPS`, ended by `attn.yield`.
    """

    KINDS: ClassVar[Mapping[str, NamedKind]] = {}
    """The named kinds; `custom` takes any extra tensors and no parameter."""
    HAS_SCORE_ARG: ClassVar[bool] = False
    WHAT: ClassVar[str] = ""

    T: ClassVar = VarConstraint("T", base(ScoresType))
    input = operand_def(T)
    extras = var_operand_def(TensorType)
    kind = prop_def(StringAttr)
    param = opt_prop_def(IntegerAttr[I64])
    body = region_def()
    output = result_def(T)
    traits = traits_def(Pure())

    def _init(
        self,
        input: SSAValue | Operation,
        kind: str,
        param: int | None,
        extras: Sequence[SSAValue | Operation],
        body: Region | None,
    ) -> None:
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {"kind": StringAttr(kind)}
        if param is not None:
            props["param"] = IntegerAttr(param, i64)
        IRDLOperation.__init__(
            self,
            operands=[input, list(extras)],
            properties=props,
            regions=[body if body is not None else Region()],
            result_types=[input.type],
        )

    def block_arg_types(self) -> list[Attribute]:
        """Types of the region's entry-block arguments."""
        head: list[Attribute] = [f32] if self.HAS_SCORE_ARG else []
        return head + [i32] * 4 + [e.type for e in self.extras]

    def verify_(self) -> None:
        if self.kind.data == "custom":
            self._verify_custom()
        else:
            self._verify_kind(self.kind.data)

    def _verify_custom(self) -> None:
        op = self.name
        if self.param is not None:
            raise VerifyException(f"{op} custom form takes no integer parameter")
        if not self.body.blocks:
            raise VerifyException(f"{op} custom form needs a region")
        block = self.body.blocks[0]
        want = self.block_arg_types()
        got = [a.type for a in block.args]
        if got != want:
            names = ("score: f32, " if self.HAS_SCORE_ARG else "") + "b, h, q_idx, kv_idx: i32"
            raise VerifyException(
                f"{op} region must take ({names}, then one argument per extra tensor): "
                f"expected ({', '.join(map(str, want))}), got ({', '.join(map(str, got))})"
            )
        term = block.last_op
        if not isinstance(term, YieldOp) or len(term.operands) != 1:
            raise VerifyException(f"{op} region must end with attn.yield of one value")
        self._check_yield(term.operands[0].type)
        for inner in self.body.walk():
            if not isinstance(inner, REGION_OPS) and inner is not term:
                raise VerifyException(
                    f"{op} region may not hold '{inner.name}'; allowed: "
                    f"{', '.join(sorted(o.name for o in REGION_OPS))}, and attn.yield last"
                )

    def _verify_kind(self, kind: str) -> None:
        op = self.name
        if kind not in self.KINDS:
            raise VerifyException(f"{op} kind must be one of {', '.join([*self.KINDS, 'custom'])}, got '{kind}'")
        if self.body.blocks:
            raise VerifyException(f"{op} {kind} takes no region")
        spec = self.KINDS[kind]
        if spec.takes_param != (self.param is not None):
            raise VerifyException(
                f"{op} {kind} " + ("needs an integer parameter" if spec.takes_param else "takes no parameter")
            )
        if len(self.extras) != spec.n_extras:
            raise VerifyException(f"{op} {kind} takes {spec.n_extras} extra tensor(s), got {len(self.extras)}")
        if self.param is not None:
            value, label = self.param.value.data, spec.param_label or kind
            if value < spec.param_min:
                raise VerifyException(f"{op} {label} must be >= {spec.param_min}, got {value}")
            if value > INT32_MAX:
                raise VerifyException(f"{op} {label} must be at most {INT32_MAX} (kernels index in i32), got {value}")
        self._verify_named(kind)

    def _check_yield(self, t: Attribute) -> None:
        if not is_float(t):
            raise VerifyException(f"{self.name} region must yield a float, got {t}")

    def _verify_named(self, kind: str) -> None:
        pass

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        if self.KINDS:  # score_mod has only the custom form and prints no kind
            printer.print_string(f" {self.kind.data}")
        if self.param is not None:
            printer.print_string(f"({self.param.value.data})")
        print_typed_operands(printer, self.extras)
        # With the keyword, an attribute dictionary cannot be mistaken for a region.
        printer.print_op_attributes(self.attributes, print_keyword=True)
        if self.body.blocks:
            printer.print_string(" ")
            printer.print_region(self.body)
        printer.print_string(" : ")
        printer.print_attribute(self.input.type)

    @classmethod
    def parse(cls, parser: Parser):
        s = parser.parse_unresolved_operand()
        if cls.KINDS:
            kind = parser.parse_identifier(f": a {cls.WHAT} kind ({', '.join([*cls.KINDS, 'custom'])})")
        else:
            kind = "custom"
            parser.parse_optional_keyword("custom")
        props: dict[str, Attribute] = {"kind": StringAttr(kind)}
        extras: list[SSAValue] = []
        while parser.parse_optional_punctuation("(") is not None:
            num = parser.parse_optional_integer(allow_boolean=False, allow_negative=True)
            if num is None:
                extras += parse_typed_operands(parser)
            else:
                props["param"] = IntegerAttr(num, i64)
                parser.parse_punctuation(")")
        attrs = parser.parse_optional_attr_dict_with_keyword()
        region = parser.parse_optional_region()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        return cls.create(
            operands=[parser.resolve_operand(s, t), *extras],
            properties=props,
            attributes=attrs.data if attrs is not None else {},
            regions=[region if region is not None else Region()],
            result_types=[t],
        )


@irdl_op_definition
class MaskOp(_ScoreFnOp):
    """Keep a score where the predicate holds, else -inf.

    Named predicates: `causal` (kv_pos <= q_pos), `sliding_window(w)`
    (0 <= q_pos - kv_pos < w), `prefix_lm(n)` (kv_pos < n or kv_pos <= q_pos),
    `document(%ids)` (ids[b, q_pos] == ids[b, kv_pos], ids an int tensor [B, Nk]);
    or `custom` with a region yielding i1. Positions as in the dialect docstring."""

    name = "attn.mask"
    WHAT: ClassVar[str] = "mask"
    KINDS: ClassVar[Mapping[str, NamedKind]] = MASK_KINDS

    def __init__(
        self,
        input: SSAValue | Operation,
        kind: str,
        param: int | None = None,
        extras: Sequence[SSAValue | Operation] = (),
        body: Region | None = None,
    ):
        self._init(input, kind, param, extras, body)

    def verify_(self) -> None:
        super().verify_()
        check_annotation(self, "blocks", KvBoundAttr, "an #attn.kv_bound<...>")

    def _check_yield(self, t: Attribute) -> None:
        if t != IntegerType(1):
            raise VerifyException(f"attn.mask region must yield i1, got {t}")

    def _verify_named(self, kind: str) -> None:
        if kind == "document":
            t = self.extras[0].type
            assert isinstance(t, TensorType)
            if len(t.get_shape()) != 2 or not isinstance(t.get_element_type(), IntegerType):
                raise VerifyException(f"attn.mask document ids must be an integer tensor [B, Nk], got {t}")


@irdl_op_definition
class BiasOp(_ScoreFnOp):
    """Add a bias to each score: `alibi(%slopes)` adds slopes[h] * (kv_pos - q_pos)
    (slopes a float tensor [H]); `custom` yields the bias from a region."""

    name = "attn.bias"
    WHAT: ClassVar[str] = "bias"
    KINDS: ClassVar[Mapping[str, NamedKind]] = BIAS_KINDS

    def __init__(
        self,
        input: SSAValue | Operation,
        kind: str,
        extras: Sequence[SSAValue | Operation] = (),
        body: Region | None = None,
    ):
        self._init(input, kind, None, extras, body)

    def _verify_named(self, kind: str) -> None:
        check_vector(self.extras[0], heads_of(self.input.type), "attn.bias alibi slopes", "one per head")


@irdl_op_definition
class ScoreModOp(_ScoreFnOp):
    """Replace each score by fn(score, b, h, q_idx, kv_idx): flex_attention's escape
    hatch. Only the `custom` (region) form exists; the region yields a float."""

    name = "attn.score_mod"
    WHAT: ClassVar[str] = "score_mod"
    HAS_SCORE_ARG: ClassVar[bool] = True

    def __init__(
        self,
        input: SSAValue | Operation,
        extras: Sequence[SSAValue | Operation] = (),
        body: Region | None = None,
    ):
        self._init(input, "custom", None, extras, body)


@irdl_op_definition
class ExtractOp(IRDLOperation):
    """Read one element of an extra tensor inside a mask/bias/score_mod region:
    `attn.extract %ids[%b, %kv] : tensor<?x?xi32>`. Indices are i32."""

    name = "attn.extract"
    T: ClassVar = VarConstraint("T", AnyAttr())
    tensor = operand_def(TensorType.constr(element_type=T))
    indices = var_operand_def(i32)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$tensor `[` $indices `]` attr-dict `:` type($tensor)"

    def __init__(self, tensor: SSAValue | Operation, indices: Sequence[SSAValue | Operation]):
        tensor = SSAValue.get(tensor)
        assert isinstance(tensor.type, TensorType)
        super().__init__(operands=[tensor, list(indices)], result_types=[tensor.type.get_element_type()])

    def verify_(self) -> None:
        t = self.tensor.type
        assert isinstance(t, TensorType)
        if len(self.indices) != len(t.get_shape()):
            raise VerifyException(f"attn.extract needs {len(t.get_shape())} indices for {t}, got {len(self.indices)}")
        parent = self.parent_op()
        if not isinstance(parent, _ScoreFnOp):
            raise VerifyException("attn.extract must be inside a mask, bias or score_mod region")
        entry = parent.body.blocks[0]
        if not (isinstance(self.tensor, BlockArgument) and self.tensor.block is entry):
            raise VerifyException(
                f"attn.extract must read an extra tensor through an argument of its {parent.name} "
                "region, not a value from outside the region"
            )


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Terminator of a mask, bias or score_mod region: its value is the result."""

    name = "attn.yield"
    values = var_operand_def(AnyAttr())
    traits = traits_def(IsTerminator(), HasParent(MaskOp, BiasOp, ScoreModOp), Pure())
    assembly_format = "attr-dict ($values^ `:` type($values))?"

    def __init__(self, *values: SSAValue | Operation):
        super().__init__(operands=[list(values)])


REGION_OPS: tuple[type[Operation], ...] = (
    ExtractOp,
    arith.ConstantOp,
    # integer arithmetic
    arith.AddiOp,
    arith.SubiOp,
    arith.MuliOp,
    arith.DivSIOp,
    arith.FloorDivSIOp,
    arith.RemSIOp,
    arith.MaxSIOp,
    arith.MinSIOp,
    arith.AndIOp,
    arith.OrIOp,
    arith.XOrIOp,
    math_dialect.AbsIOp,
    # float arithmetic
    arith.AddfOp,
    arith.SubfOp,
    arith.MulfOp,
    arith.DivfOp,
    arith.NegfOp,
    arith.MaximumfOp,
    arith.MinimumfOp,
    arith.MaxnumfOp,
    arith.MinnumfOp,
    math_dialect.ExpOp,
    math_dialect.Exp2Op,
    math_dialect.LogOp,
    math_dialect.Log2Op,
    math_dialect.TanhOp,
    math_dialect.SqrtOp,
    math_dialect.RsqrtOp,
    math_dialect.AbsFOp,
    math_dialect.SinOp,
    math_dialect.CosOp,
    math_dialect.PowFOp,
    # comparisons and selection
    arith.CmpiOp,
    arith.CmpfOp,
    arith.SelectOp,
    # casts
    arith.SIToFPOp,
    arith.UIToFPOp,
    arith.FPToSIOp,
    arith.ExtSIOp,
    arith.ExtUIOp,
    arith.TruncIOp,
    arith.IndexCastOp,
    arith.ExtFOp,
    arith.TruncFOp,
)
"""The ops a mask, bias or score_mod region may hold (besides its final attn.yield): the
verifier rejects any other. The reference executor and the Triton lowering each cover
exactly this list (python_tests/test_region_ops.py)."""


def new_region(arg_types: Sequence[Attribute]) -> tuple[Region, Block]:
    """An empty single-block region for a custom mask/bias/score_mod."""
    block = Block(arg_types=arg_types)
    return Region(block), block
