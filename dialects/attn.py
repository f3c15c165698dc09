"""The `attn` dialect: attention as a composition of ten building blocks.

A variant is a `func.func` whose arguments are q, k, v (`tensor<?xHx?xDxT>`, batch
and sequence dynamic, heads and head dim static) plus extra tensors (ALiBi slopes,
document ids, QK-norm weights, sink logits). Pre-matmul ops (`attn.rope`,
`attn.norm`, `attn.scale` on tensors) transform q or k; `attn.qk` produces the
never-materialised score matrix (`!attn.scores<H>`); post-matmul ops (`attn.mask`,
`attn.bias`, `attn.softcap`, `attn.score_mod`, `attn.scale` on scores) transform
scores; `attn.softmax` turns scores into probabilities (`!attn.probs<H>`) and
`attn.pv` multiplies them with v.

Positions: key/value token j has position j (0..Nk-1); a tensor of N rows holds the
*last* N positions of the key sequence (Nk-N..Nk-1), so queries are the last Nq
tokens (the KV-cache convention) and RoPE and masks agree for prefill and decode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from xdsl.dialects import arith
from xdsl.dialects import math as math_dialect
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DictionaryAttr,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    NoneAttr,
    StringAttr,
    TensorType,
    UnitAttr,
    f32,
    f64,
    i1,
    i32,
    i64,
)
from xdsl.dialects.utils.enum_attribute import EnumAttribute
from xdsl.ir import (
    Attribute,
    Block,
    BlockArgument,
    Dialect,
    Operation,
    ParametrizedAttribute,
    Region,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
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
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

LOG2E = 1.4426950408889634
"""log2(e): exp(x) = exp2(x * LOG2E). Kernels run the softmax in base 2."""

INT32_MAX = (1 << 31) - 1
"""Kernels compute positions in i32, so integer mask parameters must fit one."""

# --------------------------------------------------------------------------- types


class _HeadsType(ParametrizedAttribute, TypeAttribute):
    """Base of the score and probability types, parametrised by their number of heads."""

    heads: IntAttr

    def __init__(self, heads: int | IntAttr):
        super().__init__(IntAttr(heads) if isinstance(heads, int) else heads)

    def verify(self) -> None:
        if self.heads.data < 1:
            raise VerifyException(f"!{self.name} needs at least one head, got {self.heads.data}")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            return (IntAttr(parser.parse_integer(allow_boolean=False, allow_negative=False)),)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_string(str(self.heads.data))


@irdl_attr_definition
class ScoresType(_HeadsType):
    """The score matrix `[B, heads, Nq, Nk]` of one attention: never materialised."""

    name = "attn.scores"
    heads: IntAttr


@irdl_attr_definition
class ProbsType(_HeadsType):
    """Row-normalised attention probabilities `[B, heads, Nq, Nk]` (softmax output)."""

    name = "attn.probs"
    heads: IntAttr


# RoPE scaling schemes: each changes only inv_freq and a magnitude factor on cos/sin.
# name -> {parameter: default or None when required}. A parameter whose default is a bool
# is a flag (`true` / `false` in the IR); the others are floats.
ROPE_SCALINGS: dict[str, dict[str, float | bool | None]] = {
    "linear": {"factor": None},
    "llama3": {
        "factor": None,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position": 8192.0,
    },
    "yarn": {
        "factor": None,
        "original_max_position": None,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": 0.0,  # 0 means the YaRN default 0.1 * ln(factor) + 1
        "truncate": True,  # round the correction range out to whole dims (false: gpt-oss)
    },
}


@irdl_attr_definition
class RopeScalingAttr(ParametrizedAttribute):
    """A RoPE frequency-scaling scheme, e.g. `#attn.rope_scaling<llama3, factor = 8.0>`.

    `linear` divides every frequency by `factor`; `llama3` divides low frequencies by
    `factor` and interpolates smoothly between `low_freq_factor` and `high_freq_factor`
    wavelengths of `original_max_position`; `yarn` blends interpolated and
    extrapolated frequencies between the `beta_fast`/`beta_slow` rotation counts
    (rounded out to whole dims unless `truncate = false`) and multiplies cos/sin by
    `attention_factor`.
    """

    name = "attn.rope_scaling"
    kind: StringAttr
    params: DictionaryAttr

    def __init__(self, kind: str, **params: float | bool):
        super().__init__(
            StringAttr(kind),
            DictionaryAttr({k: _scaling_param(v) for k, v in params.items()}),
        )

    @property
    def values(self) -> dict[str, float | bool]:
        """The parameters with defaults filled in."""
        spec = ROPE_SCALINGS.get(self.kind.data, {})
        out = {k: v for k, v in spec.items() if v is not None}
        for k, v in self.params.data.items():
            if isinstance(v, IntegerAttr):
                out[k] = bool(v.value.data)
            else:
                assert isinstance(v, FloatAttr)
                out[k] = float(v.value.data)
        return out

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            kind = parser.parse_identifier("rope scaling kind (linear, llama3 or yarn)")
            params: dict[str, Attribute] = {}
            while parser.parse_optional_punctuation(",") is not None:
                key = parser.parse_identifier("rope scaling parameter name")
                parser.parse_punctuation("=")
                flag = parser.parse_optional_boolean()
                params[key] = _scaling_param(flag if flag is not None else float(parser.parse_number()))
        return (StringAttr(kind), DictionaryAttr(params))

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_string(self.kind.data)
            for k, v in self.params.data.items():
                if isinstance(v, IntegerAttr):
                    printer.print_string(f", {k} = {'true' if v.value.data else 'false'}")
                else:
                    assert isinstance(v, FloatAttr)
                    printer.print_string(f", {k} = {_fmt_float(float(v.value.data))}")

    def verify(self) -> None:
        kind = self.kind.data
        if kind not in ROPE_SCALINGS:
            raise VerifyException(f"unknown rope scaling '{kind}', expected one of {', '.join(ROPE_SCALINGS)}")
        spec = ROPE_SCALINGS[kind]
        for k, v in self.params.data.items():
            if k not in spec:
                raise VerifyException(f"rope scaling '{kind}' has no parameter '{k}', expected {', '.join(spec)}")
            if isinstance(spec[k], bool):
                if not (isinstance(v, IntegerAttr) and v.type == i1):
                    raise VerifyException(f"rope scaling parameter '{k}' must be true or false")
            elif not isinstance(v, FloatAttr):
                raise VerifyException(f"rope scaling parameter '{k}' must be a float")
        for k, default in spec.items():
            if default is None and k not in self.params.data:
                raise VerifyException(f"rope scaling '{kind}' needs parameter '{k}'")
        vals = self.values
        if vals["factor"] <= 0:
            raise VerifyException(f"rope scaling factor must be > 0, got {vals['factor']}")
        if kind == "llama3" and not vals["high_freq_factor"] > vals["low_freq_factor"] > 0:
            raise VerifyException("llama3 rope scaling needs high_freq_factor > low_freq_factor > 0")
        if "original_max_position" in vals and vals["original_max_position"] <= 0:
            raise VerifyException("rope scaling original_max_position must be > 0")


def _scaling_param(v: float | bool) -> Attribute:
    """A rope scaling parameter's attribute: a flag as an i1, a number as an f64."""
    return IntegerAttr(int(v), i1) if isinstance(v, bool) else FloatAttr(float(v), f64)


def _fmt_float(v: float) -> str:
    """The shortest text that reads back as `v`, in a form the MLIR lexer takes as a
    float: it needs a `.` in the mantissa, so `1e-06` is printed as `1.0e-06`."""
    text = repr(float(v))
    if "n" in text:  # inf, nan: only in IR that fails to verify
        return text
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + e + exponent


# --------------------------------------------------------------------------- named score-function kinds


@dataclass(frozen=True)
class NamedKind:
    """A named form of `attn.mask` or `attn.bias` (`causal`, `alibi(%slopes)`, ...):
    its operands, for the verifier."""

    name: str
    takes_param: bool = False
    """It takes an integer parameter, `sliding_window(128)`."""
    param_min: int = 0
    """The smallest parameter allowed (the largest is INT32_MAX)."""
    param_label: str = ""
    """How diagnostics name the parameter; default: the kind's name."""
    n_extras: int = 0
    """The number of extra tensor operands, `document(%ids : ...)`."""


@dataclass(frozen=True)
class MaskKind(NamedKind):
    """A named mask predicate, with what the passes may assume of it."""

    kv_bounded: bool = False
    """The keys a query keeps are one interval of positions, computable from the query's
    position: causal-split can skip whole KV blocks and run others without mask code."""
    causal_like: bool = False
    """No query keeps a key after its own position (kv_pos <= q_pos): about half of the
    (Q block, KV block) pairs are skipped (rope-fusion's cost model)."""


MASK_KINDS: dict[str, MaskKind] = {
    k.name: k
    for k in (
        MaskKind("causal", kv_bounded=True, causal_like=True),
        MaskKind("sliding_window", takes_param=True, param_min=1, kv_bounded=True, causal_like=True),
        MaskKind("prefix_lm", takes_param=True, param_label="prefix_lm length", kv_bounded=True),
        MaskKind("document", n_extras=1),
    )
}
"""The named predicates of `attn.mask`; their meaning is in `MaskOp`'s docstring."""

BIAS_KINDS: dict[str, NamedKind] = {"alibi": NamedKind("alibi", n_extras=1)}
"""The named biases of `attn.bias`."""


# --------------------------------------------------------------------------- pass annotations
# The passes decide, then record their decisions on the ops for convert-attn-to-tl:
# rope-fusion marks each pre-matmul op with a `placement` and attn.qk with `q_prescale`
# (and `log2e_folded`); causal-split marks each attn.mask with `blocks` and the function
# with `attn.kv_blocks`. The ops' verifiers check the annotations' types.


class Placement(StrEnum):
    """Where a pre-matmul op (attn.rope, attn.norm, attn.scale on q or k) runs."""

    Q_PROLOGUE = "q_prologue"
    """Once per Q tile, in the kernel prologue."""
    KV_LOOP = "kv_loop"
    """On every K tile, inside the KV loop."""
    PREROTATE = "prerotate"
    """Once per K row, in a separate kernel that writes a transformed copy of K."""


@irdl_attr_definition
class PlacementAttr(EnumAttribute[Placement]):
    """`#attn.placement<q_prologue | kv_loop | prerotate>`: rope-fusion's `placement`."""

    name = "attn.placement"

    def print_parameter(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            super().print_parameter(printer)

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> Placement:
        with parser.in_angle_brackets():
            return super().parse_parameter(parser)


@irdl_attr_definition
class KvBoundAttr(ParametrizedAttribute):
    """causal-split's classification of one mask: `#attn.kv_bound<causal>`,
    `#attn.kv_bound<sliding_window(128)>`, `#attn.kv_bound<prefix_lm(64)>` (a named
    mask kind that bounds the KV range, `MaskKind.kv_bounded`) or `#attn.kv_bound<opaque>`
    (a predicate the pass cannot bound: every visited block is masked)."""

    name = "attn.kv_bound"
    kind: StringAttr
    param: IntAttr | NoneAttr

    OPAQUE: ClassVar[str] = "opaque"

    def __init__(self, kind: str, param: int | None = None):
        super().__init__(StringAttr(kind), NoneAttr() if param is None else IntAttr(param))

    @property
    def mask_kind(self) -> MaskKind | None:
        """The bounding mask kind; None when opaque."""
        return MASK_KINDS.get(self.kind.data)

    @property
    def param_value(self) -> int:
        """The kind's integer parameter (0 when it takes none)."""
        return self.param.data if isinstance(self.param, IntAttr) else 0

    def verify(self) -> None:
        kind = self.kind.data
        if kind == self.OPAQUE:
            spec = NamedKind(kind)
        else:
            bounded = [k for k, m in MASK_KINDS.items() if m.kv_bounded]
            if kind not in bounded:
                raise VerifyException(
                    f"#attn.kv_bound kind must be one of {', '.join([*bounded, 'opaque'])}, got '{kind}'"
                )
            spec = MASK_KINDS[kind]
        if spec.takes_param != isinstance(self.param, IntAttr):
            raise VerifyException(
                f"#attn.kv_bound<{kind}> "
                + ("needs an integer parameter" if spec.takes_param else "takes no parameter")
            )

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            kind = parser.parse_identifier("KV bound kind")
            param = None
            if parser.parse_optional_punctuation("(") is not None:
                param = parser.parse_integer(allow_boolean=False)
                parser.parse_punctuation(")")
        return (StringAttr(kind), NoneAttr() if param is None else IntAttr(param))

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_string(self.kind.data)
            if isinstance(self.param, IntAttr):
                printer.print_string(f"({self.param.data})")


def _check_annotation(op: Operation, key: str, kind: type[Attribute], what: str) -> None:
    """A pass annotation `key` on `op`, when present, must be a `kind`."""
    value = op.attributes.get(key)
    if value is not None and not isinstance(value, kind):
        raise VerifyException(f"{op.name} annotation '{key}' must be {what}, got {value}")


def _check_placement(op: Operation) -> None:
    _check_annotation(op, "placement", PlacementAttr, "an #attn.placement<q_prologue|kv_loop|prerotate>")


# --------------------------------------------------------------------------- helpers


def _qkv_shape(value: SSAValue, what: str) -> tuple[int, ...]:
    """Shape of a `[B, H, N, D]` tensor operand; heads and head dim must be static."""
    t = value.type
    if not isinstance(t, TensorType) or len(t.get_shape()) != 4:
        raise VerifyException(f"{what} must be a rank-4 tensor [B, H, N, D], got {t}")
    shape = t.get_shape()
    if shape[1] < 1 or shape[3] < 1:
        raise VerifyException(f"{what} must have static heads and head dim, got {t}")
    if not _is_float(t.get_element_type()):
        raise VerifyException(f"{what} must have a float element type, got {t}")
    return tuple(shape)


def _is_float(t: Attribute) -> bool:
    from xdsl.dialects.builtin import AnyFloat

    return isinstance(t, AnyFloat)


def _float_prop(value: float) -> FloatAttr:
    return FloatAttr(float(value), f64)


def _heads(t: Attribute) -> int:
    if isinstance(t, ScoresType | ProbsType):
        return t.heads.data
    assert isinstance(t, TensorType)
    return t.get_shape()[1]


# --------------------------------------------------------------------------- pre-matmul ops


@irdl_op_definition
class RopeOp(IRDLOperation):
    """Rotary position embedding of q or k.

    Pairs of the first `rotary_dim` channels are rotated by angle pos * inv_freq[i]:
    `half` style pairs channel i with i + rotary_dim/2 (GPT-NeoX, HF Llama),
    `interleaved` pairs 2i with 2i+1 (GPT-J). inv_freq[i] = theta^(-2i/rotary_dim),
    changed by `scaling`, or given explicitly as the `inv_freq` operand
    (`tensor<rotary_dim/2 x f32>`). Channels past `rotary_dim` pass through.
    """

    name = "attn.rope"
    input = operand_def(TensorType)
    inv_freq = opt_operand_def(TensorType)
    theta = prop_def(FloatAttr)
    style = prop_def(StringAttr)
    rotary_dim = prop_def(IntegerAttr)
    scaling = opt_prop_def(RopeScalingAttr)
    output = result_def(TensorType)
    traits = traits_def(Pure())

    STYLES: ClassVar = ("half", "interleaved")

    def __init__(
        self,
        input: SSAValue | Operation,
        *,
        theta: float = 10000.0,
        style: str = "half",
        rotary_dim: int,
        scaling: RopeScalingAttr | None = None,
        inv_freq: SSAValue | Operation | None = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {
            "theta": _float_prop(theta),
            "style": StringAttr(style),
            "rotary_dim": IntegerAttr(rotary_dim, i64),
        }
        if scaling is not None:
            props["scaling"] = scaling
        super().__init__(
            operands=[input, [] if inv_freq is None else [inv_freq]],
            properties=props,
            result_types=[input.type],
        )

    def verify_(self) -> None:
        shape = _qkv_shape(self.input, "attn.rope input")
        _check_placement(self)
        if self.output.type != self.input.type:
            raise VerifyException("attn.rope result type must equal its input type")
        d = shape[3]
        r = self.rotary_dim.value.data
        if r <= 0 or r % 2 or r > d:
            raise VerifyException(f"attn.rope rotary_dim must be even, positive and at most the head dim {d}, got {r}")
        if not self.theta.value.data > 0 or math.isinf(self.theta.value.data):
            raise VerifyException(f"attn.rope theta must be > 0 and finite, got {self.theta.value.data}")
        if self.style.data not in self.STYLES:
            raise VerifyException(f"attn.rope style must be 'half' or 'interleaved', got '{self.style.data}'")
        if self.inv_freq is not None:
            t = self.inv_freq.type
            assert isinstance(t, TensorType)
            if t.get_shape() != (r // 2,) or not _is_float(t.get_element_type()):
                raise VerifyException(f"attn.rope inv_freq must be tensor<{r // 2}xf32> (rotary_dim / 2), got {t}")
            if self.scaling is not None:
                raise VerifyException("attn.rope takes either an inv_freq operand or scaling")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        printer.print_string(f" {self.style.data}")
        printer.print_string(f" theta = {_fmt_float(self.theta.value.data)}")
        printer.print_string(f" rotary_dim = {self.rotary_dim.value.data}")
        if self.scaling is not None:
            printer.print_string(" scaling = ")
            printer.print_attribute(self.scaling)
        if self.inv_freq is not None:
            printer.print_string(" inv_freq(")
            printer.print_operand(self.inv_freq)
            printer.print_string(" : ")
            printer.print_attribute(self.inv_freq.type)
            printer.print_string(")")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.input.type)

    @classmethod
    def parse(cls, parser: Parser) -> RopeOp:
        x = parser.parse_unresolved_operand()
        style = parser.parse_identifier("rope style (half or interleaved)")
        parser.parse_keyword("theta")
        parser.parse_punctuation("=")
        theta = float(parser.parse_number())
        parser.parse_keyword("rotary_dim")
        parser.parse_punctuation("=")
        rdim = parser.parse_integer(allow_boolean=False)
        scaling = None
        if parser.parse_optional_keyword("scaling") is not None:
            parser.parse_punctuation("=")
            start = parser.pos
            scaling = parser.parse_attribute()
            if not isinstance(scaling, RopeScalingAttr):
                parser.raise_error(
                    f"attn.rope scaling must be a #attn.rope_scaling<...> attribute, got {scaling}", start
                )
        inv_freq = None
        if parser.parse_optional_keyword("inv_freq") is not None:
            with parser.in_parens():
                f = parser.parse_unresolved_operand()
                parser.parse_punctuation(":")
                inv_freq = parser.resolve_operand(f, parser.parse_type())
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        op = cls(
            parser.resolve_operand(x, t),
            theta=theta,
            style=style,
            rotary_dim=rdim,
            scaling=scaling,
            inv_freq=inv_freq,
        )
        op.attributes.update(attrs)
        return op


@irdl_op_definition
class NormOp(IRDLOperation):
    """RMS normalisation of q or k over the head dim (QK-norm, as in Qwen3, Gemma 3):
    x * rsqrt(mean(x^2) + eps) * weight, with an optional `weight` of shape [D]."""

    name = "attn.norm"
    input = operand_def(TensorType)
    weight = opt_operand_def(TensorType)
    eps = prop_def(FloatAttr)
    output = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(
        self,
        input: SSAValue | Operation,
        weight: SSAValue | Operation | None = None,
        eps: float = 1e-6,
    ):
        input = SSAValue.get(input)
        super().__init__(
            operands=[input, [] if weight is None else [weight]],
            properties={"eps": _float_prop(eps)},
            result_types=[input.type],
        )

    def verify_(self) -> None:
        shape = _qkv_shape(self.input, "attn.norm input")
        _check_placement(self)
        if self.output.type != self.input.type:
            raise VerifyException("attn.norm result type must equal its input type")
        if not self.eps.value.data > 0:
            raise VerifyException(f"attn.norm eps must be > 0, got {self.eps.value.data}")
        if self.weight is not None:
            t = self.weight.type
            assert isinstance(t, TensorType)
            if t.get_shape() != (shape[3],) or not _is_float(t.get_element_type()):
                raise VerifyException(
                    f"attn.norm weight must be a float tensor<{shape[3]}x...> (the head dim), got {t}"
                )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        printer.print_string(f" eps = {_fmt_float(self.eps.value.data)}")
        if self.weight is not None:
            printer.print_string(" weight(")
            printer.print_operand(self.weight)
            printer.print_string(" : ")
            printer.print_attribute(self.weight.type)
            printer.print_string(")")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.input.type)

    @classmethod
    def parse(cls, parser: Parser) -> NormOp:
        x = parser.parse_unresolved_operand()
        parser.parse_keyword("eps")
        parser.parse_punctuation("=")
        eps = float(parser.parse_number())
        weight = None
        if parser.parse_optional_keyword("weight") is not None:
            with parser.in_parens():
                w = parser.parse_unresolved_operand()
                parser.parse_punctuation(":")
                weight = parser.resolve_operand(w, parser.parse_type())
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        op = cls(parser.resolve_operand(x, t), weight, eps)
        op.attributes.update(attrs)
        return op


class _ScalarOp(IRDLOperation):
    """Base of ops with one input, one float property and a result of the input's type."""

    PROP: ClassVar[str] = ""

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.operands[0])
        value = self.properties[self.PROP]
        assert isinstance(value, FloatAttr)
        printer.print_string(f" {self.PROP} = {_fmt_float(value.value.data)}")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.operands[0].type)

    @classmethod
    def parse(cls, parser: Parser):
        x = parser.parse_unresolved_operand()
        parser.parse_keyword(cls.PROP)
        parser.parse_punctuation("=")
        value = float(parser.parse_number())
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        op = cls(parser.resolve_operand(x, t), value)
        op.attributes.update(attrs)
        return op


@irdl_op_definition
class ScaleOp(_ScalarOp):
    """Multiply q or k (before the matmul) or the scores (after it) by a constant."""

    name = "attn.scale"
    PROP: ClassVar[str] = "value"
    input = operand_def(AnyAttr())
    value = prop_def(FloatAttr)
    output = result_def(AnyAttr())
    traits = traits_def(Pure())

    def __init__(self, input: SSAValue | Operation, value: float):
        input = SSAValue.get(input)
        super().__init__(operands=[input], properties={"value": _float_prop(value)}, result_types=[input.type])

    def verify_(self) -> None:
        if isinstance(self.input.type, TensorType):
            _qkv_shape(self.input, "attn.scale input")
            _check_placement(self)
        elif not isinstance(self.input.type, ScoresType):
            raise VerifyException(f"attn.scale input must be a q/k tensor or !attn.scores, got {self.input.type}")
        if self.output.type != self.input.type:
            raise VerifyException("attn.scale result type must equal its input type")
        if not math.isfinite(self.value.value.data):
            raise VerifyException(f"attn.scale value must be finite, got {self.value.value.data}")


@irdl_op_definition
class SoftcapOp(_ScalarOp):
    """Cap scores smoothly: cap * tanh(s / cap) (Gemma 2, Grok)."""

    name = "attn.softcap"
    PROP: ClassVar[str] = "cap"
    input = operand_def(ScoresType)
    cap = prop_def(FloatAttr)
    output = result_def(ScoresType)
    traits = traits_def(Pure())

    def __init__(self, input: SSAValue | Operation, cap: float):
        input = SSAValue.get(input)
        super().__init__(operands=[input], properties={"cap": _float_prop(cap)}, result_types=[input.type])

    def verify_(self) -> None:
        if self.output.type != self.input.type:
            raise VerifyException("attn.softcap result type must equal its input type")
        cap = self.cap.value.data
        if not (cap > 0 and math.isfinite(cap)):
            raise VerifyException(f"attn.softcap cap must be > 0 and finite, got {cap}")


# --------------------------------------------------------------------------- the matmuls


@irdl_op_definition
class QKOp(IRDLOperation):
    """Scores = q . k^T * scale (default 1/sqrt(head dim)).

    With GQA, q has a multiple of k's heads: query head h reads kv head
    h // (Hq / Hkv)."""

    name = "attn.qk"
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    scale = opt_prop_def(FloatAttr)
    scores = result_def(ScoresType)
    traits = traits_def(Pure())

    def __init__(self, q: SSAValue | Operation, k: SSAValue | Operation, scale: float | None = None):
        q, k = SSAValue.get(q), SSAValue.get(k)
        assert isinstance(q.type, TensorType)
        props = {} if scale is None else {"scale": _float_prop(scale)}
        super().__init__(operands=[q, k], properties=props, result_types=[ScoresType(q.type.get_shape()[1])])

    @property
    def effective_scale(self) -> float:
        if self.scale is not None:
            return self.scale.value.data
        assert isinstance(self.q.type, TensorType)
        return 1.0 / math.sqrt(self.q.type.get_shape()[3])

    def verify_(self) -> None:
        qs = _qkv_shape(self.q, "attn.qk q")
        ks = _qkv_shape(self.k, "attn.qk k")
        if qs[3] != ks[3]:
            raise VerifyException(f"attn.qk q and k head dims differ: {qs[3]} vs {ks[3]}")
        qt, kt = self.q.type, self.k.type
        assert isinstance(qt, TensorType) and isinstance(kt, TensorType)
        q_elem, k_elem = qt.get_element_type(), kt.get_element_type()
        if q_elem != k_elem:
            raise VerifyException(f"attn.qk q and k element types differ: {q_elem} vs {k_elem}")
        if qs[1] % ks[1]:
            raise VerifyException(f"attn.qk q heads ({qs[1]}) must be a multiple of k heads ({ks[1]})")
        if DYNAMIC_INDEX not in (qs[0], ks[0]) and qs[0] != ks[0]:
            raise VerifyException(f"attn.qk q and k batch sizes differ: {qs[0]} vs {ks[0]}")
        if _heads(self.scores.type) != qs[1]:
            raise VerifyException(f"attn.qk result must be !attn.scores<{qs[1]}> (q heads), got {self.scores.type}")
        if self.scale is not None:
            s = self.scale.value.data
            if not (s > 0 and math.isfinite(s)):
                raise VerifyException(f"attn.qk scale must be > 0 and finite, got {s}")
        _check_annotation(self, "q_prescale", FloatAttr, "a float")
        _check_annotation(self, "log2e_folded", UnitAttr, "a unit attribute")

    @property
    def log2e_folded(self) -> bool:
        """rope-fusion folded the softmax's LOG2E into `q_prescale`."""
        return "log2e_folded" in self.attributes

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.q)
        printer.print_string(", ")
        printer.print_operand(self.k)
        if self.scale is not None:
            printer.print_string(f" scale = {_fmt_float(self.scale.value.data)}")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.q.type)
        printer.print_string(", ")
        printer.print_attribute(self.k.type)
        printer.print_string(" -> ")
        printer.print_attribute(self.scores.type)

    @classmethod
    def parse(cls, parser: Parser) -> QKOp:
        q = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        k = parser.parse_unresolved_operand()
        scale = None
        if parser.parse_optional_keyword("scale") is not None:
            parser.parse_punctuation("=")
            scale = float(parser.parse_number())
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        qt = parser.parse_type()
        parser.parse_punctuation(",")
        kt = parser.parse_type()
        parser.parse_punctuation("->")
        st = parser.parse_type()
        op = cls.create(
            operands=[parser.resolve_operand(q, qt), parser.resolve_operand(k, kt)],
            properties={} if scale is None else {"scale": _float_prop(scale)},
            attributes=attrs,
            result_types=[st],
        )
        return op


@irdl_op_definition
class SoftmaxOp(IRDLOperation):
    """Row softmax of the scores (online in kernels).

    With a `sink` (one logit per query head, gpt-oss), each row's normaliser also
    counts exp(sink[h]): p = exp(s) / (exp(sink) + sum exp(s)). A row whose scores
    are all masked gives zeros."""

    name = "attn.softmax"
    input = operand_def(ScoresType)
    sink = opt_operand_def(TensorType)
    output = result_def(ProbsType)
    traits = traits_def(Pure())

    def __init__(self, input: SSAValue | Operation, sink: SSAValue | Operation | None = None):
        input = SSAValue.get(input)
        assert isinstance(input.type, ScoresType)
        super().__init__(
            operands=[input, [] if sink is None else [sink]],
            result_types=[ProbsType(input.type.heads)],
        )

    def verify_(self) -> None:
        h = _heads(self.input.type)
        if _heads(self.output.type) != h:
            raise VerifyException(f"attn.softmax result must be !attn.probs<{h}>")
        if self.sink is not None:
            t = self.sink.type
            assert isinstance(t, TensorType)
            if t.get_shape() != (h,) or not _is_float(t.get_element_type()):
                raise VerifyException(
                    f"attn.softmax sink must be a float tensor<{h}x...> (one logit per query head), got {t}"
                )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        if self.sink is not None:
            printer.print_string(" sink(")
            printer.print_operand(self.sink)
            printer.print_string(" : ")
            printer.print_attribute(self.sink.type)
            printer.print_string(")")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.input.type)
        printer.print_string(" -> ")
        printer.print_attribute(self.output.type)

    @classmethod
    def parse(cls, parser: Parser) -> SoftmaxOp:
        s = parser.parse_unresolved_operand()
        sink = None
        if parser.parse_optional_keyword("sink") is not None:
            with parser.in_parens():
                v = parser.parse_unresolved_operand()
                parser.parse_punctuation(":")
                sink = parser.resolve_operand(v, parser.parse_type())
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        st = parser.parse_type()
        parser.parse_punctuation("->")
        pt = parser.parse_type()
        return cls.create(
            operands=[parser.resolve_operand(s, st)] + ([sink] if sink else []),
            attributes=attrs,
            result_types=[pt],
        )


@irdl_op_definition
class PVOp(IRDLOperation):
    """out = p . v: the probabilities (an `attn.softmax` result) times the values.

    The result is `[B, Hq, Nq, Dv]`; its element type is the output dtype."""

    name = "attn.pv"
    p = operand_def(ProbsType)
    v = operand_def(TensorType)
    output = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, p: SSAValue | Operation, v: SSAValue | Operation, result_type: TensorType):
        super().__init__(operands=[p, v], result_types=[result_type])

    def verify_(self) -> None:
        if not isinstance(self.p.owner, SoftmaxOp):
            raise VerifyException("attn.pv must be fed by an attn.softmax result")
        vs = _qkv_shape(self.v, "attn.pv v")
        h = _heads(self.p.type)
        if h % vs[1]:
            raise VerifyException(f"attn.pv probs heads ({h}) must be a multiple of v heads ({vs[1]})")
        os_ = _qkv_shape(self.output, "attn.pv result")
        if os_[1] != h or os_[3] != vs[3]:
            raise VerifyException(
                f"attn.pv result must have {h} heads and head dim {vs[3]} (v's), got {self.output.type}"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.p)
        printer.print_string(", ")
        printer.print_operand(self.v)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.p.type)
        printer.print_string(", ")
        printer.print_attribute(self.v.type)
        printer.print_string(" -> ")
        printer.print_attribute(self.output.type)

    @classmethod
    def parse(cls, parser: Parser) -> PVOp:
        p = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        v = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        pt = parser.parse_type()
        parser.parse_punctuation(",")
        vt = parser.parse_type()
        parser.parse_punctuation("->")
        ot = parser.parse_type()
        return cls.create(
            operands=[parser.resolve_operand(p, pt), parser.resolve_operand(v, vt)],
            attributes=attrs,
            result_types=[ot],
        )


# --------------------------------------------------------------------------- score modifiers


class _ScoreFnOp(IRDLOperation):
    """Base of `attn.mask`, `attn.bias` and `attn.score_mod`.

    Syntax: `attn.mask %s <kind>[(<int>)][(%extra : type, ...)] [attributes {...}] [{ region }] : type`.
    A named kind (`causal`, `sliding_window(w)`, ...) has an empty region; the
    `custom` kind carries a region whose entry block takes ([score: f32,] b, h,
    q_idx, kv_idx: i32, then one argument per extra tensor) and yields the result.
    A region holds only the ops of `REGION_OPS`, ended by `attn.yield`.
    """

    KINDS: ClassVar[dict[str, NamedKind]] = {}
    """The named kinds; `custom` takes any extra tensors and no parameter."""
    HAS_SCORE_ARG: ClassVar[bool] = False
    WHAT: ClassVar[str] = ""

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
        return head + [i32] * 4 + [e.type for e in self.operands[1:]]

    def verify_(self) -> None:
        op = self.name
        kind = self.properties["kind"]
        assert isinstance(kind, StringAttr)
        kind = kind.data
        extras = self.operands[1:]
        param = self.properties.get("param")
        region: Region = self.regions[0]
        if self.results[0].type != self.operands[0].type:
            raise VerifyException(f"{op} result type must equal its input type")
        if kind == "custom":
            if param is not None:
                raise VerifyException(f"{op} custom form takes no integer parameter")
            if not region.blocks:
                raise VerifyException(f"{op} custom form needs a region")
            block = region.blocks[0]
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
            for inner in region.walk():
                if not isinstance(inner, REGION_OPS) and inner is not term:
                    raise VerifyException(
                        f"{op} region may not hold '{inner.name}'; allowed: "
                        f"{', '.join(sorted(o.name for o in REGION_OPS))}, and attn.yield last"
                    )
            return
        if kind not in self.KINDS:
            raise VerifyException(f"{op} kind must be one of {', '.join([*self.KINDS, 'custom'])}, got '{kind}'")
        if region.blocks:
            raise VerifyException(f"{op} {kind} takes no region")
        spec = self.KINDS[kind]
        if spec.takes_param != (param is not None):
            raise VerifyException(
                f"{op} {kind} " + ("needs an integer parameter" if spec.takes_param else "takes no parameter")
            )
        if len(extras) != spec.n_extras:
            raise VerifyException(f"{op} {kind} takes {spec.n_extras} extra tensor(s), got {len(extras)}")
        if isinstance(param, IntegerAttr):
            value, label = param.value.data, spec.param_label or kind
            if value < spec.param_min:
                raise VerifyException(f"{op} {label} must be >= {spec.param_min}, got {value}")
            if value > INT32_MAX:
                raise VerifyException(f"{op} {label} must be at most {INT32_MAX} (kernels index in i32), got {value}")
        self._verify_named(kind)

    def _check_yield(self, t: Attribute) -> None:
        raise NotImplementedError

    def _verify_named(self, kind: str) -> None:
        pass

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.operands[0])
        kind = self.properties["kind"]
        assert isinstance(kind, StringAttr)
        if self.KINDS:  # score_mod has only the custom form and prints no kind
            printer.print_string(f" {kind.data}")
        param = self.properties.get("param")
        if isinstance(param, IntegerAttr):
            printer.print_string(f"({param.value.data})")
        extras = self.operands[1:]
        if extras:
            printer.print_string("(")
            for i, e in enumerate(extras):
                if i:
                    printer.print_string(", ")
                printer.print_operand(e)
                printer.print_string(" : ")
                printer.print_attribute(e.type)
            printer.print_string(")")
        # With the keyword, an attribute dictionary cannot be mistaken for a region.
        printer.print_op_attributes(self.attributes, print_keyword=True)
        if self.regions[0].blocks:
            printer.print_string(" ")
            printer.print_region(self.regions[0])
        printer.print_string(" : ")
        printer.print_attribute(self.operands[0].type)

    @classmethod
    def parse(cls, parser: Parser):
        s = parser.parse_unresolved_operand()
        if cls.KINDS:
            kind = parser.parse_identifier(f"{cls.WHAT} kind")
        else:
            kind = "custom"
            parser.parse_optional_keyword("custom")
        param = None
        extras: list[SSAValue] = []
        while parser.parse_optional_punctuation("(") is not None:
            num = parser.parse_optional_integer(allow_boolean=False, allow_negative=True)
            if num is not None:
                param = num
            else:
                while True:
                    e = parser.parse_unresolved_operand()
                    parser.parse_punctuation(":")
                    extras.append(parser.resolve_operand(e, parser.parse_type()))
                    if parser.parse_optional_punctuation(",") is None:
                        break
            parser.parse_punctuation(")")
        attrs = parser.parse_optional_attr_dict_with_keyword()
        region = parser.parse_optional_region()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        props: dict[str, Attribute] = {"kind": StringAttr(kind)}
        if param is not None:
            props["param"] = IntegerAttr(param, i64)
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
    KINDS: ClassVar[dict[str, NamedKind]] = MASK_KINDS
    input = operand_def(ScoresType)
    extras = var_operand_def(TensorType)
    kind = prop_def(StringAttr)
    param = opt_prop_def(IntegerAttr)
    body = region_def()
    output = result_def(ScoresType)
    traits = traits_def(Pure())

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
        _check_annotation(self, "blocks", KvBoundAttr, "an #attn.kv_bound<...>")

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
    KINDS: ClassVar[dict[str, NamedKind]] = BIAS_KINDS
    input = operand_def(ScoresType)
    extras = var_operand_def(TensorType)
    kind = prop_def(StringAttr)
    param = opt_prop_def(IntegerAttr)
    body = region_def()
    output = result_def(ScoresType)
    traits = traits_def(Pure())

    def __init__(
        self,
        input: SSAValue | Operation,
        kind: str,
        extras: Sequence[SSAValue | Operation] = (),
        body: Region | None = None,
    ):
        self._init(input, kind, None, extras, body)

    def _check_yield(self, t: Attribute) -> None:
        if not _is_float(t):
            raise VerifyException(f"attn.bias region must yield a float, got {t}")

    def _verify_named(self, kind: str) -> None:
        t = self.extras[0].type
        assert isinstance(t, TensorType)
        h = _heads(self.input.type)
        if t.get_shape() != (h,) or not _is_float(t.get_element_type()):
            raise VerifyException(f"attn.bias alibi slopes must be a float tensor<{h}x...> (one per head), got {t}")


@irdl_op_definition
class ScoreModOp(_ScoreFnOp):
    """Replace each score by fn(score, b, h, q_idx, kv_idx): flex_attention's escape
    hatch. Only the `custom` (region) form exists; the region yields a float."""

    name = "attn.score_mod"
    WHAT: ClassVar[str] = "score_mod"
    HAS_SCORE_ARG: ClassVar[bool] = True
    KINDS: ClassVar[dict[str, NamedKind]] = {}
    input = operand_def(ScoresType)
    extras = var_operand_def(TensorType)
    kind = prop_def(StringAttr)
    param = opt_prop_def(IntegerAttr)
    body = region_def()
    output = result_def(ScoresType)
    traits = traits_def(Pure())

    def __init__(
        self,
        input: SSAValue | Operation,
        extras: Sequence[SSAValue | Operation] = (),
        body: Region | None = None,
    ):
        self._init(input, "custom", None, extras, body)

    def _check_yield(self, t: Attribute) -> None:
        if not _is_float(t):
            raise VerifyException(f"attn.score_mod region must yield a float, got {t}")


@irdl_op_definition
class ExtractOp(IRDLOperation):
    """Read one element of an extra tensor inside a mask/bias/score_mod region:
    `attn.extract %ids[%b, %kv] : tensor<?x?xi32>`. Indices are i32."""

    name = "attn.extract"
    tensor = operand_def(TensorType)
    indices = var_operand_def(IntegerType)
    result = result_def(AnyAttr())
    traits = traits_def(Pure())

    def __init__(self, tensor: SSAValue | Operation, indices: Sequence[SSAValue | Operation]):
        tensor = SSAValue.get(tensor)
        assert isinstance(tensor.type, TensorType)
        super().__init__(operands=[tensor, list(indices)], result_types=[tensor.type.get_element_type()])

    def verify_(self) -> None:
        t = self.tensor.type
        assert isinstance(t, TensorType)
        if len(self.indices) != len(t.get_shape()):
            raise VerifyException(f"attn.extract needs {len(t.get_shape())} indices for {t}, got {len(self.indices)}")
        if any(i.type != i32 for i in self.indices):
            raise VerifyException("attn.extract indices must be i32")
        if self.result.type != t.get_element_type():
            raise VerifyException("attn.extract result must be the tensor's element type")
        parent = self.parent_op()
        if not isinstance(parent, _ScoreFnOp):
            raise VerifyException("attn.extract must be inside a mask, bias or score_mod region")
        entry = parent.regions[0].blocks[0]
        if not (isinstance(self.tensor, BlockArgument) and self.tensor.block is entry):
            raise VerifyException(
                f"attn.extract must read an extra tensor through an argument of its {parent.name} "
                "region, not a value from outside the region"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.tensor)
        printer.print_string("[")
        printer.print_list(self.indices, printer.print_operand)
        printer.print_string("]")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.tensor.type)

    @classmethod
    def parse(cls, parser: Parser) -> ExtractOp:
        t = parser.parse_unresolved_operand()
        idx = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_unresolved_operand)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        tt = parser.parse_type()
        op = cls(parser.resolve_operand(t, tt), [parser.resolve_operand(i, i32) for i in idx])
        op.attributes.update(attrs)
        return op


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


PRE_MATMUL_OPS = (RopeOp, NormOp, ScaleOp)
SCORE_OPS = (ScaleOp, MaskOp, BiasOp, SoftcapOp, ScoreModOp)

Attn = Dialect(
    "attn",
    [
        RopeOp,
        NormOp,
        ScaleOp,
        QKOp,
        MaskOp,
        BiasOp,
        SoftcapOp,
        ScoreModOp,
        SoftmaxOp,
        PVOp,
        ExtractOp,
        YieldOp,
    ],
    [ScoresType, ProbsType, RopeScalingAttr, PlacementAttr, KvBoundAttr],
)
