"""The `attn` dialect's types and attributes, and the constants its ops and passes share.

Types: `!attn.scores<H>` and `!attn.probs<H>`. Attributes: RoPE's `style` and
`#attn.rope_scaling<...>`; the pass annotations `#attn.placement<...>` and
`#attn.kv_bound<...>`. Registries: the named kinds of `attn.mask` and `attn.bias`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from xdsl.dialects.builtin import (
    AnyFloat,
    DictionaryAttr,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    NoneAttr,
    StringAttr,
    TensorType,
    f64,
    i1,
)
from xdsl.dialects.utils.enum_attribute import EnumAttribute
from xdsl.ir import Attribute, Operation, ParametrizedAttribute, SpacedOpaqueSyntaxAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
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


class RopeStyle(StrEnum):
    """Which channels `attn.rope` pairs."""

    HALF = "half"
    """Channel i with i + rotary_dim/2 (GPT-NeoX, HF Llama)."""
    INTERLEAVED = "interleaved"
    """Channel 2i with 2i+1 (GPT-J)."""


@irdl_attr_definition
class RopeStyleAttr(EnumAttribute[RopeStyle], SpacedOpaqueSyntaxAttribute):
    """`attn.rope`'s `style`: a bare `half` or `interleaved` in the op's syntax,
    `#attn<rope_style half>` on its own."""

    name = "attn.rope_style"


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
            kind = parser.parse_identifier(": a rope scaling kind (linear, llama3 or yarn)")
            params: dict[str, Attribute] = {}
            while parser.parse_optional_punctuation(",") is not None:
                key = parser.parse_identifier(": a rope scaling parameter name (such as factor)")
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
                    printer.print_string(f", {k} = {fmt_float(float(v.value.data))}")

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
        for k, v in vals.items():
            if not isinstance(v, bool) and not math.isfinite(v):
                raise VerifyException(f"rope scaling parameter '{k}' must be finite, got {v}")
        if vals["factor"] <= 0:
            raise VerifyException(f"rope scaling factor must be > 0, got {vals['factor']}")
        if kind == "llama3" and not vals["high_freq_factor"] > vals["low_freq_factor"] > 0:
            raise VerifyException("llama3 rope scaling needs high_freq_factor > low_freq_factor > 0")
        if "original_max_position" in vals and vals["original_max_position"] <= 0:
            raise VerifyException("rope scaling original_max_position must be > 0")
        if kind == "yarn" and (vals["beta_fast"] <= 0 or vals["beta_slow"] <= 0 or vals["attention_factor"] < 0):
            raise VerifyException("yarn rope scaling needs beta_fast > 0, beta_slow > 0 and attention_factor >= 0")


def _scaling_param(v: float | bool) -> Attribute:
    """A rope scaling parameter's attribute: a flag as an i1, a number as an f64."""
    return IntegerAttr(int(v), i1) if isinstance(v, bool) else FloatAttr(float(v), f64)


def fmt_float(v: float) -> str:
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
# rope-fusion marks each pre-matmul op with a `placement` and attn.qk with `score_scale`
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
    CACHE = "cache"
    """When the key is written to a KV cache (`Variant.cache_keys`): a decode kernel reads K
    transformed already."""


@irdl_attr_definition
class PlacementAttr(EnumAttribute[Placement]):
    """`#attn.placement<q_prologue | kv_loop | prerotate | cache>`: rope-fusion's `placement`."""

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
            kind = parser.parse_identifier(": a KV bound kind")
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


def check_annotation(op: Operation, key: str, kind: type[Attribute], what: str) -> None:
    """A pass annotation `key` on `op`, when present, must be a `kind`."""
    value = op.attributes.get(key)
    if value is not None and not isinstance(value, kind):
        raise VerifyException(f"{op.name} annotation '{key}' must be {what}, got {value}")


# --------------------------------------------------------------------------- helpers


def is_float(t: Attribute) -> bool:
    return isinstance(t, AnyFloat)


def heads_of(t: Attribute) -> int:
    """The number of heads of scores, probabilities or a `[B, H, N, D]` tensor."""
    if isinstance(t, ScoresType | ProbsType):
        return t.heads.data
    assert isinstance(t, TensorType)
    return t.get_shape()[1]
