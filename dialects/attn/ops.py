"""The `attn` ops before the score modifiers: the pre-matmul transforms of q and k
(`attn.rope`, `attn.norm`, `attn.scale`), the matmuls (`attn.qk`, `attn.pv`), and the
reductions between them (`attn.softcap`, `attn.softmax`). Each prints with a declarative
`assembly_format`; floats keep their shortest exact spelling (`custom<Float>`)."""

from __future__ import annotations

import math
import re
from typing import ClassVar

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    I64,
    Float64Type,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    TensorType,
    UnitAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    AnyAttr,
    AttrSizedOperandSegments,
    IRDLOperation,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.irdl.declarative_assembly_format import (
    AttributeVariable,
    CustomDirective,
    ParsingState,
    PrintingState,
    irdl_custom_directive,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.mlir_lexer import MLIRTokenKind

from attnfuse.dialects.attn.attributes import (
    PlacementAttr,
    ProbsType,
    RopeScalingAttr,
    RopeStyle,
    RopeStyleAttr,
    ScoresType,
    check_annotation,
    fmt_float,
    heads_of,
    is_float,
)


@irdl_custom_directive
class Float(CustomDirective):
    """An f64 property written as its shortest exact decimal, `0.125` or `1.0e-06`
    (the default, `1.250000e-01`, reads worse)."""

    value: AttributeVariable

    def parse(self, parser: Parser, state: ParsingState) -> None:
        first = parser._current_token.span  # xDSL has no public peek
        number = parser.parse_number()
        token = parser._current_token
        if (
            token.kind == MLIRTokenKind.BARE_IDENT
            and token.span.start == first.end
            and re.fullmatch(r"[eE][0-9]+", token.text)
        ):  # MLIR lexes `1e999` as the integer 1 and the name `e999`
            parser.raise_error(
                f"a float with an exponent needs a '.': write {first.text}.0{token.text}", first.start, token.span.end
            )
        self.value.set(state, FloatAttr(float(number), f64))

    def print(self, printer: Printer, state: PrintingState, op: IRDLOperation) -> None:
        attr = self.value.get(op)
        assert isinstance(attr, FloatAttr)
        state.print_whitespace(printer)
        printer.print_string(fmt_float(attr.value.data))

    def is_anchorable(self) -> bool:
        return self.value.is_anchorable()

    def is_present(self, op: IRDLOperation) -> bool:
        return self.value.is_present(op)


def qkv_shape(value: SSAValue, what: str) -> tuple[int, ...]:
    """Shape of a `[B, H, N, D]` tensor operand; heads and head dim must be static."""
    t = value.type
    if not isinstance(t, TensorType) or len(t.get_shape()) != 4:
        raise VerifyException(f"{what} must be a rank-4 tensor [B, H, N, D], got {t}")
    shape = t.get_shape()
    if shape[1] < 1 or shape[3] < 1:
        raise VerifyException(f"{what} must have static heads and head dim, got {t}")
    if not is_float(t.get_element_type()):
        raise VerifyException(f"{what} must have a float element type, got {t}")
    return tuple(shape)


def check_vector(value: SSAValue | None, length: int, what: str, why: str) -> None:
    """An optional operand `what`, when present, must be a float tensor<length x ...>
    (`why` says what the length is)."""
    if value is None:
        return
    t = value.type
    assert isinstance(t, TensorType)
    if t.get_shape() != (length,) or not is_float(t.get_element_type()):
        raise VerifyException(f"{what} must be a float tensor<{length}x...> ({why}), got {t}")


def check_positions(positions: SSAValue | None, what: str) -> None:
    """An optional positions operand, when present, must be an integer tensor [N] or [B, N]."""
    if positions is None:
        return
    t = positions.type
    assert isinstance(t, TensorType)
    if len(t.get_shape()) not in (1, 2) or not isinstance(t.get_element_type(), IntegerType):
        raise VerifyException(f"{what} positions must be an integer tensor [N] or [B, N], got {t}")


def _check_placement(op: Operation) -> None:
    check_annotation(op, "placement", PlacementAttr, "an #attn.placement<q_prologue|kv_loop|prerotate|cache>")


def _f64(value: float) -> FloatAttr:
    return FloatAttr(float(value), f64)


# --------------------------------------------------------------------------- pre-matmul ops


@irdl_op_definition
class RopeOp(IRDLOperation):
    """Rotary position embedding of q or k.

    Pairs of the first `rotary_dim` channels are rotated by angle pos * inv_freq[i], pos
    the token's position: by default the row's (queries are the last Nq of Nk positions),
    or `positions[b, n]` (`positions[n]`) from the optional integer `positions` operand,
    [B, N] or [N] over the input's rows (padded or packed batches, KV caches, shards):
    `half` style pairs channel i with i + rotary_dim/2 (GPT-NeoX, HF Llama),
    `interleaved` pairs 2i with 2i+1 (GPT-J). inv_freq[i] = theta^(-2i/rotary_dim),
    changed by `scaling`, or given explicitly as the `inv_freq` operand
    (`tensor<rotary_dim/2 x f32>`). Channels past `rotary_dim` pass through.
    """

    name = "attn.rope"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    inv_freq = opt_operand_def(TensorType)
    positions = opt_operand_def(TensorType)
    theta = prop_def(FloatAttr[Float64Type])
    style = prop_def(RopeStyleAttr)
    rotary_dim = prop_def(IntegerAttr[I64])
    scaling = opt_prop_def(RopeScalingAttr)
    output = result_def(T)
    traits = traits_def(Pure())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    custom_directives = (Float,)
    assembly_format = (
        "$input $style `theta` `=` custom<Float>($theta) `rotary_dim` `=` $rotary_dim"
        " (`scaling` `=` qualified($scaling)^)? (`inv_freq` `(` $inv_freq^ `:` type($inv_freq) `)`)?"
        " (`positions` `(` $positions^ `:` type($positions) `)`)?"
        " attr-dict `:` type($input)"
    )

    STYLES: ClassVar = tuple(RopeStyle)

    def __init__(
        self,
        input: SSAValue | Operation,
        *,
        theta: float = 10000.0,
        style: str = "half",
        rotary_dim: int,
        scaling: RopeScalingAttr | None = None,
        inv_freq: SSAValue | Operation | None = None,
        positions: SSAValue | Operation | None = None,
    ):
        input = SSAValue.get(input)
        props: dict[str, Attribute] = {
            "theta": _f64(theta),
            "style": RopeStyleAttr(RopeStyle(style)),
            "rotary_dim": IntegerAttr(rotary_dim, i64),
        }
        if scaling is not None:
            props["scaling"] = scaling
        super().__init__(
            operands=[input, [] if inv_freq is None else [inv_freq], [] if positions is None else [positions]],
            properties=props,
            result_types=[input.type],
        )

    def verify_(self) -> None:
        d = qkv_shape(self.input, "attn.rope input")[3]
        check_positions(self.positions, "attn.rope")
        _check_placement(self)
        r = self.rotary_dim.value.data
        if r <= 0 or r % 2 or r > d:
            raise VerifyException(f"attn.rope rotary_dim must be even, positive and at most the head dim {d}, got {r}")
        theta = self.theta.value.data
        if not theta > 0 or math.isinf(theta):
            raise VerifyException(f"attn.rope theta must be > 0 and finite, got {theta}")
        if self.scaling is not None and self.scaling.kind.data == "yarn" and not theta > 1:
            # YaRN's correction range divides by ln(theta).
            raise VerifyException(f"attn.rope with yarn scaling needs theta > 1, got {theta}")
        if self.inv_freq is not None:
            t = self.inv_freq.type
            assert isinstance(t, TensorType)
            if t.get_shape() != (r // 2,) or not is_float(t.get_element_type()):
                raise VerifyException(f"attn.rope inv_freq must be tensor<{r // 2}xf32> (rotary_dim / 2), got {t}")
            if self.scaling is not None:
                raise VerifyException("attn.rope takes either an inv_freq operand or scaling")


@irdl_op_definition
class NormOp(IRDLOperation):
    """RMS normalisation of q or k over the head dim (QK-norm, as in Qwen3, Gemma 3):
    x * rsqrt(mean(x^2) + eps) * weight, with an optional `weight` of shape [D]."""

    name = "attn.norm"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    weight = opt_operand_def(TensorType)
    eps = prop_def(FloatAttr[Float64Type])
    output = result_def(T)
    traits = traits_def(Pure())
    custom_directives = (Float,)
    assembly_format = (
        "$input `eps` `=` custom<Float>($eps) (`weight` `(` $weight^ `:` type($weight) `)`)? attr-dict `:` type($input)"
    )

    def __init__(self, input: SSAValue | Operation, weight: SSAValue | Operation | None = None, eps: float = 1e-6):
        input = SSAValue.get(input)
        super().__init__(
            operands=[input, [] if weight is None else [weight]],
            properties={"eps": _f64(eps)},
            result_types=[input.type],
        )

    def verify_(self) -> None:
        shape = qkv_shape(self.input, "attn.norm input")
        _check_placement(self)
        if not 0 < self.eps.value.data < math.inf:
            raise VerifyException(f"attn.norm eps must be > 0 and finite, got {self.eps.value.data}")
        check_vector(self.weight, shape[3], "attn.norm weight", "the head dim")


E4M3_MAX = 448.0
"""The largest finite float8 e4m3 (`e4m3fn`) value: a quantization block's largest magnitude maps to it."""


@irdl_op_definition
class HadamardOp(IRDLOperation):
    """Incoherent processing of q or k for low precision: x @ M with M = diag(s) H / sqrt(D), H
    the Sylvester Hadamard matrix of the head dim D (a power of two) and s a fixed vector of
    random signs drawn from `seed`. M is orthogonal, so the same rotation on q and on k leaves
    the scores unchanged while spreading outlier channels over all of them."""

    name = "attn.hadamard"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    seed = prop_def(IntegerAttr[I64])
    output = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$input `seed` `=` $seed attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation, seed: int = 0):
        input = SSAValue.get(input)
        super().__init__(operands=[input], properties={"seed": IntegerAttr(seed, i64)}, result_types=[input.type])

    def verify_(self) -> None:
        d = qkv_shape(self.input, "attn.hadamard input")[3]
        _check_placement(self)
        if d != DYNAMIC_INDEX and (d < 1 or d & (d - 1)):
            raise VerifyException(f"attn.hadamard needs a head dim that is a power of two, got {d}")
        if self.seed.value.data < 0:
            raise VerifyException(f"attn.hadamard seed must be >= 0, got {self.seed.value.data}")


@irdl_op_definition
class QuantizeOp(IRDLOperation):
    """q, k or v as float8 e4m3 holds it: each element divided by its block's scale, rounded to
    e4m3 and multiplied back. A block is `block` consecutive rows of one (batch, head), and its
    scale the block's largest magnitude over e4m3's largest value (448); `block` = 0 is one
    scale for the whole tensor. The last transform of its operand: the product reads e4m3
    values and their scales, and descales."""

    name = "attn.quantize"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    block = prop_def(IntegerAttr[I64])
    output = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$input `e4m3` `block` `=` $block attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation, block: int = 0):
        input = SSAValue.get(input)
        super().__init__(operands=[input], properties={"block": IntegerAttr(block, i64)}, result_types=[input.type])

    def verify_(self) -> None:
        qkv_shape(self.input, "attn.quantize input")
        _check_placement(self)
        if self.block.value.data < 0:
            raise VerifyException(
                f"attn.quantize block must be >= 0 rows (0: one scale per tensor), got {self.block.value.data}"
            )
        for use in self.output.uses:
            if not isinstance(use.operation, QKOp | PVOp):
                raise VerifyException(
                    f"attn.quantize must be the last transform before attn.qk or attn.pv, but its result feeds "
                    f"'{use.operation.name}'"
                )


def chain_ops(value: SSAValue) -> list[Operation]:
    """The pre-matmul ops that compute `value` from a function argument, first to last."""
    ops: list[Operation] = []
    while isinstance(value.owner, RopeOp | NormOp | ScaleOp | HadamardOp | QuantizeOp):
        ops.append(value.owner)
        value = value.owner.operands[0]
    return ops[::-1]


@irdl_op_definition
class ScaleOp(IRDLOperation):
    """Multiply q or k (before the matmul) or the scores (after it) by a constant."""

    name = "attn.scale"
    T: ClassVar = VarConstraint("T", AnyAttr())
    input = operand_def(T)
    value = prop_def(FloatAttr[Float64Type])
    output = result_def(T)
    traits = traits_def(Pure())
    custom_directives = (Float,)
    assembly_format = "$input `value` `=` custom<Float>($value) attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation, value: float):
        input = SSAValue.get(input)
        super().__init__(operands=[input], properties={"value": _f64(value)}, result_types=[input.type])

    def verify_(self) -> None:
        if isinstance(self.input.type, TensorType):
            qkv_shape(self.input, "attn.scale input")
            _check_placement(self)
        elif not isinstance(self.input.type, ScoresType):
            raise VerifyException(f"attn.scale input must be a q/k tensor or !attn.scores, got {self.input.type}")
        if not math.isfinite(self.value.value.data):
            raise VerifyException(f"attn.scale value must be finite, got {self.value.value.data}")


@irdl_op_definition
class SoftcapOp(IRDLOperation):
    """Cap scores smoothly: cap * tanh(s / cap) (Gemma 2, Grok)."""

    name = "attn.softcap"
    T: ClassVar = VarConstraint("T", base(ScoresType))
    input = operand_def(T)
    cap = prop_def(FloatAttr[Float64Type])
    output = result_def(T)
    traits = traits_def(Pure())
    custom_directives = (Float,)
    assembly_format = "$input `cap` `=` custom<Float>($cap) attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation, cap: float):
        input = SSAValue.get(input)
        super().__init__(operands=[input], properties={"cap": _f64(cap)}, result_types=[input.type])

    def verify_(self) -> None:
        cap = self.cap.value.data
        if not (cap > 0 and math.isfinite(cap)):
            raise VerifyException(f"attn.softcap cap must be > 0 and finite, got {cap}")


# --------------------------------------------------------------------------- the matmuls and the softmax


@irdl_op_definition
class QKOp(IRDLOperation):
    """Scores = q . k^T * scale (default 1/sqrt(head dim)).

    With GQA, q has a multiple of k's heads: query head h reads kv head
    h // (Hq / Hkv)."""

    name = "attn.qk"
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    scale = opt_prop_def(FloatAttr[Float64Type])
    scores = result_def(ScoresType)
    traits = traits_def(Pure())
    custom_directives = (Float,)
    assembly_format = (
        "$q `,` $k (`scale` `=` custom<Float>($scale)^)? attr-dict `:` type($q) `,` type($k) `->` type($scores)"
    )

    def __init__(self, q: SSAValue | Operation, k: SSAValue | Operation, scale: float | None = None):
        q, k = SSAValue.get(q), SSAValue.get(k)
        assert isinstance(q.type, TensorType)
        props = {} if scale is None else {"scale": _f64(scale)}
        super().__init__(operands=[q, k], properties=props, result_types=[ScoresType(IntAttr(q.type.get_shape()[1]))])

    @property
    def effective_scale(self) -> float:
        if self.scale is not None:
            return self.scale.value.data
        assert isinstance(self.q.type, TensorType)
        return 1.0 / math.sqrt(self.q.type.get_shape()[3])

    @property
    def log2e_folded(self) -> bool:
        """rope-fusion folded the softmax's LOG2E into `score_scale`."""
        return "log2e_folded" in self.attributes

    def verify_(self) -> None:
        qs = qkv_shape(self.q, "attn.qk q")
        ks = qkv_shape(self.k, "attn.qk k")
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
        if heads_of(self.scores.type) != qs[1]:
            raise VerifyException(f"attn.qk result must be !attn.scores<{qs[1]}> (q heads), got {self.scores.type}")
        if self.scale is not None:
            s = self.scale.value.data
            if not (s > 0 and math.isfinite(s)):
                raise VerifyException(f"attn.qk scale must be > 0 and finite, got {s}")
        check_annotation(self, "score_scale", FloatAttr, "a float")
        check_annotation(self, "log2e_folded", UnitAttr, "a unit attribute")
        seeds = [[op.seed.value.data for op in chain_ops(x) if isinstance(op, HadamardOp)] for x in (self.q, self.k)]
        if seeds[0] != seeds[1]:
            raise VerifyException(
                f"attn.qk: q and k must go through the same attn.hadamard rotations (the scores are unchanged only "
                f"then), got seeds {seeds[0]} on q and {seeds[1]} on k"
            )


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
    assembly_format = "$input (`sink` `(` $sink^ `:` type($sink) `)`)? attr-dict `:` type($input) `->` type($output)"

    def __init__(self, input: SSAValue | Operation, sink: SSAValue | Operation | None = None):
        input = SSAValue.get(input)
        assert isinstance(input.type, ScoresType)
        super().__init__(operands=[input, [] if sink is None else [sink]], result_types=[ProbsType(input.type.heads)])

    def verify_(self) -> None:
        h = heads_of(self.input.type)
        if heads_of(self.output.type) != h:
            raise VerifyException(f"attn.softmax result must be !attn.probs<{h}>")
        check_vector(self.sink, h, "attn.softmax sink", "one logit per query head")


@irdl_op_definition
class PVOp(IRDLOperation):
    """out = p . v: the probabilities (an `attn.softmax` result) times the values.

    The result is `[B, Hq, Nq, Dv]`; its element type is the output dtype."""

    name = "attn.pv"
    p = operand_def(ProbsType)
    v = operand_def(TensorType)
    output = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$p `,` $v attr-dict `:` type($p) `,` type($v) `->` type($output)"

    def __init__(self, p: SSAValue | Operation, v: SSAValue | Operation, result_type: TensorType):
        super().__init__(operands=[p, v], result_types=[result_type])

    def verify_(self) -> None:
        if not isinstance(self.p.owner, SoftmaxOp):
            raise VerifyException("attn.pv must be fed by an attn.softmax result")
        vs = qkv_shape(self.v, "attn.pv v")
        h = heads_of(self.p.type)
        if h % vs[1]:
            raise VerifyException(f"attn.pv probs heads ({h}) must be a multiple of v heads ({vs[1]})")
        os_ = qkv_shape(self.output, "attn.pv result")
        if os_[1] != h or os_[3] != vs[3]:
            raise VerifyException(
                f"attn.pv result must have {h} heads and head dim {vs[3]} (v's), got {self.output.type}"
            )
