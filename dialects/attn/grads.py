"""The `attn` ops of a backward program: the derivatives of the blocks, as `attn-autodiff`
writes them.

A backward function recomputes the forward's ops (the scores and probabilities are never
materialised, so kernels recompute them from the saved log-sum-exp) and then applies these
ops in reverse order of the forward. Linear blocks need no op of their own: the
derivative of `attn.scale` is `attn.scale` by the same constant, and masks and biases pass
the score gradient through unchanged (a masked score has probability 0, so its gradient
is 0 already). An elementwise score op's derivative is an `attn.score_mod` computing
d out / d in, multiplied into the gradient by `attn.score_mul`.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, Float64Type, FloatAttr, IntAttr, IntegerAttr, TensorType
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
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
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn.attributes import (
    ProbsType,
    RopeScalingAttr,
    RopeStyle,
    RopeStyleAttr,
    ScoresType,
    heads_of,
)
from attnfuse.dialects.attn.ops import Float, _f64, check_positions, check_vector, qkv_shape


def _same_type(a: SSAValue, b: SSAValue, what: str) -> None:
    if a.type != b.type:
        raise VerifyException(f"{what}: {a.type} vs {b.type}")


@irdl_op_definition
class PVGradOp(IRDLOperation):
    """The derivative of `attn.pv` (out = p . v) given dout: dp = dout . v^T (scores-shaped)
    and dv = p^T . dout, summed over the query heads that share each kv head (GQA)."""

    name = "attn.pv_grad"
    V: ClassVar = VarConstraint("V", base(TensorType))
    p = operand_def(ProbsType)
    v = operand_def(V)
    dout = operand_def(TensorType)
    dp = result_def(ScoresType)
    dv = result_def(V)
    traits = traits_def(Pure())
    assembly_format = "$p `,` $v `,` $dout attr-dict `:` type($p) `,` type($v) `,` type($dout) `->` type($dp)"

    def __init__(self, p: SSAValue | Operation, v: SSAValue | Operation, dout: SSAValue | Operation):
        p, v = SSAValue.get(p), SSAValue.get(v)
        super().__init__(operands=[p, v, dout], result_types=[ScoresType(IntAttr(heads_of(p.type))), v.type])

    def verify_(self) -> None:
        vs = qkv_shape(self.v, "attn.pv_grad v")
        ds = qkv_shape(self.dout, "attn.pv_grad dout")
        h = heads_of(self.p.type)
        if ds[1] != h or ds[3] != vs[3]:
            raise VerifyException(f"attn.pv_grad dout must have {h} heads and head dim {vs[3]}, got {self.dout.type}")
        if heads_of(self.dp.type) != h:
            raise VerifyException(f"attn.pv_grad dp must be !attn.scores<{h}>, got {self.dp.type}")
        _same_type(self.dv, self.v, "attn.pv_grad dv must have v's type")


@irdl_op_definition
class SoftmaxGradOp(IRDLOperation):
    """The derivative of `attn.softmax` given dp: ds = p * (dp - delta), where delta is
    each row's sum of dout * out (= sum_j p_j dp_j, counting the sink's zero gradient
    contribution). Works the same with a sink."""

    name = "attn.softmax_grad"
    p = operand_def(ProbsType)
    dp = operand_def(ScoresType)
    out = operand_def(TensorType)
    dout = operand_def(TensorType)
    ds = result_def(ScoresType)
    traits = traits_def(Pure())
    assembly_format = (
        "$p `,` $dp `,` $out `,` $dout attr-dict `:` type($p) `,` type($dp) `,` type($out) `,` type($dout) "
        "`->` type($ds)"
    )

    def __init__(
        self, p: SSAValue | Operation, dp: SSAValue | Operation, out: SSAValue | Operation, dout: SSAValue | Operation
    ):
        dp = SSAValue.get(dp)
        super().__init__(operands=[p, dp, out, dout], result_types=[dp.type])

    def verify_(self) -> None:
        h = heads_of(self.p.type)
        for value, what in ((self.dp, "dp"), (self.ds, "ds")):
            if heads_of(value.type) != h:
                raise VerifyException(f"attn.softmax_grad {what} must be !attn.scores<{h}>, got {value.type}")
        qkv_shape(self.out, "attn.softmax_grad out")
        _same_type(self.out, self.dout, "attn.softmax_grad out and dout must have one type")


@irdl_op_definition
class SinkGradOp(IRDLOperation):
    """The gradient of a softmax sink logit (one per query head): the sum over batch and
    rows of -exp(sink[h] - lse) * delta, delta each row's sum of dout * out."""

    name = "attn.sink_grad"
    S: ClassVar = VarConstraint("S", base(TensorType))
    sink = operand_def(S)
    lse = operand_def(TensorType)
    out = operand_def(TensorType)
    dout = operand_def(TensorType)
    dsink = result_def(S)
    traits = traits_def(Pure())
    assembly_format = (
        "$sink `,` $lse `,` $out `,` $dout attr-dict `:` type($sink) `,` type($lse) `,` type($out) `,` type($dout)"
    )

    def __init__(
        self,
        sink: SSAValue | Operation,
        lse: SSAValue | Operation,
        out: SSAValue | Operation,
        dout: SSAValue | Operation,
    ):
        sink = SSAValue.get(sink)
        super().__init__(operands=[sink, lse, out, dout], result_types=[sink.type])

    def verify_(self) -> None:
        h = qkv_shape(self.out, "attn.sink_grad out")[1]
        check_vector(self.sink, h, "attn.sink_grad sink", "one logit per query head")
        lse = self.lse.type
        if not isinstance(lse, TensorType) or len(lse.get_shape()) != 3 or lse.get_shape()[1] != h:
            raise VerifyException(f"attn.sink_grad lse must be a tensor [B, {h}, Nq], got {lse}")
        _same_type(self.dsink, self.sink, "attn.sink_grad result must have the sink's type")


@irdl_op_definition
class ScoreMulOp(IRDLOperation):
    """The elementwise product of two score matrices: a score gradient times the
    derivative of an elementwise score op."""

    name = "attn.score_mul"
    T: ClassVar = VarConstraint("T", base(ScoresType))
    lhs = operand_def(T)
    rhs = operand_def(T)
    output = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs)"

    def __init__(self, lhs: SSAValue | Operation, rhs: SSAValue | Operation):
        lhs = SSAValue.get(lhs)
        super().__init__(operands=[lhs, rhs], result_types=[lhs.type])

    def verify_(self) -> None:
        _same_type(self.lhs, self.rhs, "attn.score_mul operands must have one type")


@irdl_op_definition
class QKGradOp(IRDLOperation):
    """The derivative of `attn.qk` (s = q . k^T * scale) given ds: dq = ds . k * scale and
    dk = ds^T . q * scale, summed over the query heads that share each kv head (GQA)."""

    name = "attn.qk_grad"
    Q: ClassVar = VarConstraint("Q", base(TensorType))
    K: ClassVar = VarConstraint("K", base(TensorType))
    ds = operand_def(ScoresType)
    q = operand_def(Q)
    k = operand_def(K)
    scale = prop_def(FloatAttr[Float64Type])
    dq = result_def(Q)
    dk = result_def(K)
    traits = traits_def(Pure())
    custom_directives = (Float,)
    assembly_format = (
        "$ds `,` $q `,` $k `scale` `=` custom<Float>($scale) attr-dict `:` type($ds) `,` type($q) `,` type($k)"
    )

    def __init__(self, ds: SSAValue | Operation, q: SSAValue | Operation, k: SSAValue | Operation, scale: float):
        q, k = SSAValue.get(q), SSAValue.get(k)
        super().__init__(operands=[ds, q, k], properties={"scale": _f64(scale)}, result_types=[q.type, k.type])

    def verify_(self) -> None:
        qs = qkv_shape(self.q, "attn.qk_grad q")
        qkv_shape(self.k, "attn.qk_grad k")
        if heads_of(self.ds.type) != qs[1]:
            raise VerifyException(f"attn.qk_grad ds must be !attn.scores<{qs[1]}>, got {self.ds.type}")
        _same_type(self.dq, self.q, "attn.qk_grad dq must have q's type")
        _same_type(self.dk, self.k, "attn.qk_grad dk must have k's type")


@irdl_op_definition
class RopeGradOp(IRDLOperation):
    """The derivative of `attn.rope` given dy: dy rotated back, by angle -pos * inv_freq[i]
    (the transpose of a rotation is its inverse). Its properties and its inv_freq and
    positions operands are those of the `attn.rope` it differentiates."""

    name = "attn.rope_grad"
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
    custom_directives = (Float,)
    assembly_format = (
        "$input $style `theta` `=` custom<Float>($theta) `rotary_dim` `=` $rotary_dim"
        " (`scaling` `=` qualified($scaling)^)? (`inv_freq` `(` $inv_freq^ `:` type($inv_freq) `)`)?"
        " (`positions` `(` $positions^ `:` type($positions) `)`)?"
        " attr-dict `:` type($input)"
    )
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, dy: SSAValue | Operation, of: Operation, mapped=lambda v: v):
        dy = SSAValue.get(dy)
        props: dict[str, Attribute] = {
            k: of.properties[k] for k in ("theta", "style", "rotary_dim", "scaling") if k in of.properties
        }
        inv_freq, positions = getattr(of, "inv_freq", None), getattr(of, "positions", None)
        super().__init__(
            operands=[
                dy,
                [] if inv_freq is None else [mapped(inv_freq)],
                [] if positions is None else [mapped(positions)],
            ],
            properties=props,
            result_types=[dy.type],
        )

    @property
    def style_name(self) -> str:
        return RopeStyle(self.style.data).value

    def verify_(self) -> None:
        d = qkv_shape(self.input, "attn.rope_grad input")[3]
        check_positions(self.positions, "attn.rope_grad")
        r = self.rotary_dim.value.data
        if r <= 0 or r % 2 or r > d:
            raise VerifyException(f"attn.rope_grad rotary_dim must be even, positive and at most {d}, got {r}")
        _same_type(self.output, self.input, "attn.rope_grad result must have its input's type")


@irdl_op_definition
class NormGradOp(IRDLOperation):
    """The derivative of `attn.norm` (y = x * r * w, r = rsqrt(mean(x^2) + eps)) given dy,
    with respect to x: r * (dy * w - x * r^2 * mean(dy * w * x))."""

    name = "attn.norm_grad"
    T: ClassVar = VarConstraint("T", base(TensorType))
    dy = operand_def(T)
    x = operand_def(TensorType)
    weight = opt_operand_def(TensorType)
    eps = prop_def(FloatAttr[Float64Type])
    dx = result_def(T)
    traits = traits_def(Pure())
    custom_directives = (Float,)
    assembly_format = (
        "$dy `,` $x `eps` `=` custom<Float>($eps) (`weight` `(` $weight^ `:` type($weight) `)`)? attr-dict "
        "`:` type($dy) `,` type($x)"
    )

    def __init__(
        self, dy: SSAValue | Operation, x: SSAValue | Operation, weight: SSAValue | Operation | None, eps: float
    ):
        dy = SSAValue.get(dy)
        super().__init__(
            operands=[dy, x, [] if weight is None else [weight]], properties={"eps": _f64(eps)}, result_types=[dy.type]
        )

    def verify_(self) -> None:
        shape = qkv_shape(self.dy, "attn.norm_grad dy")
        if qkv_shape(self.x, "attn.norm_grad x")[1:] != shape[1:]:
            raise VerifyException(f"attn.norm_grad x must have dy's heads and head dim, got {self.x.type}")
        check_vector(self.weight, shape[3], "attn.norm_grad weight", "the head dim")


@irdl_op_definition
class NormWeightGradOp(IRDLOperation):
    """The gradient of `attn.norm`'s weight given dy: the sum over batch, heads and tokens
    of dy * x * rsqrt(mean(x^2) + eps), a vector over the head dim."""

    name = "attn.norm_weight_grad"
    dy = operand_def(TensorType)
    x = operand_def(TensorType)
    eps = prop_def(FloatAttr[Float64Type])
    dweight = result_def(TensorType)
    traits = traits_def(Pure())
    custom_directives = (Float,)
    assembly_format = (
        "$dy `,` $x `eps` `=` custom<Float>($eps) attr-dict `:` type($dy) `,` type($x) `->` type($dweight)"
    )

    def __init__(self, dy: SSAValue | Operation, x: SSAValue | Operation, eps: float, weight_type: Attribute):
        super().__init__(operands=[dy, x], properties={"eps": _f64(eps)}, result_types=[weight_type])

    def verify_(self) -> None:
        shape = qkv_shape(self.dy, "attn.norm_weight_grad dy")
        check_vector(self.dweight, shape[3], "attn.norm_weight_grad result", "the head dim")


GRAD_OPS = (PVGradOp, SoftmaxGradOp, SinkGradOp, ScoreMulOp, QKGradOp, RopeGradOp, NormGradOp, NormWeightGradOp)
"""The ops a backward program adds to the forward's."""
