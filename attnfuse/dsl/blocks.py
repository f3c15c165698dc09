"""The ten building blocks (`af.rope` ... `af.pv`) and RoPE's scaling schemes.

Each block checks its arguments, appends its `attn` op to the variant being traced
(`attnfuse.dsl.tracing`) and verifies it at once, so that a bad block is reported where
it is called. The scaling builders (`linear_scaling`, `llama3_scaling`, `yarn_scaling`,
`rope_scaling`) make the `#attn.rope_scaling` attribute of `af.rope(scaling=...)`.

Numeric parameters are checked here, so that no backend ever sees a value it would
treat differently from another: each must be a Python number (not a bool) that f32
holds finitely, as kernels compute in f32, and theta, eps, the qk scale, the softcap
cap and the scaling parameters must be > 0 (theta > 1 with yarn scaling; a yarn
attention_factor may be 0, YaRN's default); rotary_dim is an even integer in
[2, head dim]. A bad value gets an `AttnFuseError` naming the
block, the argument, the accepted range and the value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, cast

import torch
from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects import attn
from attnfuse.dsl.predicates import CustomMask, NamedMask, _Alibi, _as_predicate, _extra_arg
from attnfuse.dsl.scalars import _F32_MAX, _describe, _Proxy, _show
from attnfuse.dsl.tracing import ELEMENT_TYPES, ProbsProxy, ScoresProxy, TensorProxy, _tracer
from attnfuse.errors import AttnFuseError

# --------------------------------------------------------------------------- rope scaling


_HF_PARAM_NAMES = {"original_max_position_embeddings": "original_max_position"}
_IGNORED_KEYS = {"type", "rope_type"}


def _scaling_attr(kind: str, **params: float | bool | None) -> attn.RopeScalingAttr:
    spec = attn.ROPE_SCALINGS[kind]
    values: dict[str, float | bool] = {}
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(spec.get(k), bool):
            if not isinstance(v, bool):
                raise AttnFuseError(f"{kind} rope scaling parameter {k} must be True or False, got {v!r}")
            values[k] = v
            continue
        # Every number is a factor, a length or a rotation count, so > 0; attention_factor
        # 0 means YaRN's default 0.1 * ln(factor) + 1.
        lower = "nonnegative" if k == "attention_factor" else "positive"
        values[k] = _real(v, f"{kind} rope scaling parameter {k}", lower)
    # Spell out every parameter with a default, so that equal schemes print (and hash) equal.
    for k, default in spec.items():
        if k not in values and default is not None and not (k == "attention_factor" and default == 0.0):
            values[k] = default
    try:
        attr = attn.RopeScalingAttr(kind, **{k: values[k] for k in spec if k in values})
        attr.verify()
    except VerifyException as e:
        raise AttnFuseError(str(e)) from None
    return attr


def linear_scaling(factor: float) -> attn.RopeScalingAttr:
    """Position interpolation: every frequency divided by `factor`."""
    return _scaling_attr("linear", factor=factor)


def llama3_scaling(
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position: float = 8192.0,
) -> attn.RopeScalingAttr:
    """Llama 3.1's scheme: wavelengths longer than original_max_position /
    low_freq_factor are divided by `factor`, shorter than original_max_position /
    high_freq_factor kept, and interpolated smoothly in between."""
    return _scaling_attr(
        "llama3",
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position=original_max_position,
    )


def yarn_scaling(
    factor: float,
    original_max_position: float,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    attention_factor: float | None = None,
    truncate: bool = True,
) -> attn.RopeScalingAttr:
    """YaRN (arXiv 2309.00071): frequencies between beta_fast and beta_slow rotations
    over original_max_position blend interpolation and extrapolation; cos and sin are
    multiplied by attention_factor (default 0.1 * ln(factor) + 1). `truncate` rounds
    the blend's dim range out to whole dims (Hugging Face's default); gpt-oss sets it
    to False."""
    return _scaling_attr(
        "yarn",
        factor=factor,
        original_max_position=original_max_position,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        attention_factor=attention_factor,
        truncate=truncate,
    )


def rope_scaling(scaling: object) -> attn.RopeScalingAttr | None:
    """The `#attn.rope_scaling` of a `scaling=` argument: None, an attribute built by
    the helpers above, or a dict such as a Hugging Face `rope_scaling` config
    (`{"rope_type": "llama3", "factor": 8.0, ...}`; "type" works as well)."""
    if scaling is None or isinstance(scaling, attn.RopeScalingAttr):
        return scaling
    if not isinstance(scaling, dict):
        raise AttnFuseError(
            f"rope scaling must be None, a dict or af.linear_scaling/llama3_scaling/yarn_scaling(...), "
            f"got {_describe(scaling)}"
        )
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind not in attn.ROPE_SCALINGS:
        raise AttnFuseError(f"unknown rope scaling type {kind!r}, expected one of {', '.join(attn.ROPE_SCALINGS)}")
    params: dict[str, Any] = {}
    for k, v in scaling.items():
        if k in _IGNORED_KEYS:
            continue
        name = _HF_PARAM_NAMES.get(k, k)
        if name not in attn.ROPE_SCALINGS[kind]:
            raise AttnFuseError(
                f"{kind} rope scaling has no parameter {k!r}, expected {', '.join(attn.ROPE_SCALINGS[kind])}"
            )
        params[name] = v
    missing = [k for k, d in attn.ROPE_SCALINGS[kind].items() if d is None and k not in params]
    if missing:
        raise AttnFuseError(f"{kind} rope scaling needs {', '.join(missing)}")
    return _scaling_attr(kind, **params)


# --------------------------------------------------------------------------- the ten blocks


_LOWER_BOUNDS = {"any": f"[-{_F32_MAX:.7g}", "nonnegative": "[0", "positive": "(0"}


def _real(x: object, what: str, lower: str = "any") -> float:
    """A numeric parameter as a float: a Python number (not a bool) that f32 holds
    finitely (kernels compute in f32; NaN and infinities are rejected), and >= 0 or > 0
    when `lower` says "nonnegative" or "positive"."""
    value = math.nan
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        try:
            value = float(x)
        except OverflowError:  # an int beyond any float
            value = math.inf
    low_ok = {"any": True, "nonnegative": value >= 0, "positive": value > 0}[lower]
    if not (low_ok and math.isfinite(value) and abs(value) <= _F32_MAX):
        raise AttnFuseError(
            f"{what} must be a number in {_LOWER_BOUNDS[lower]}, {_F32_MAX:.7g}] (finite in f32, in which "
            f"kernels compute), got {_show(x)}"
        )
    return value


def _tensor(x: object, what: str) -> TensorProxy:
    if isinstance(x, TensorProxy) and not x.is_output:
        return x
    if isinstance(x, TensorProxy):
        raise AttnFuseError(f"{what} expects q, k or v, got the output of af.pv")
    raise AttnFuseError(f"{what} expects q, k or v (a tensor argument of the variant), got {_describe(x)}")


def _scores(x: object, what: str) -> ScoresProxy:
    if isinstance(x, ScoresProxy):
        return x
    raise AttnFuseError(f"{what} expects scores (the result of af.qk or a score block), got {_describe(x)}")


def _rotary_dim(r: object, x: TensorProxy) -> int:
    """af.rope's rotary_dim: an even int (channels rotate in pairs) in [2, head dim]."""
    if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 2 <= int(r) <= x.head_dim or int(r) % 2:
        raise AttnFuseError(
            f"af.rope rotary_dim must be an even integer in [2, {x.head_dim}] ({x.name}'s head dim), got {_show(r)}"
        )
    return int(r)


_POSITION_DTYPES = (torch.int32, torch.int64)


def _positions(p: object, x: TensorProxy) -> SSAValue:
    """af.rope's positions: an int32/int64 tensor argument of the variant, [B, N] or [N],
    N the rows of x (Nq when x derives from the variant's first argument, else Nk: k and
    v share a length). The sizes are checked against each call's q and k
    (`attnfuse.validation.validate_extras`)."""
    extra = _extra_arg(p, "af.rope positions")._extra
    spec = extra.spec
    if spec.dtype not in _POSITION_DTYPES or spec.ndim not in (1, 2):
        raise AttnFuseError(
            f"af.rope positions ({extra.name}) must be an integer tensor [B, N] or [N] (torch.int32 or "
            f"torch.int64) of {x.name}'s token positions, got a {spec.ndim}-d {spec.dtype} tensor"
        )
    source = x.value
    while not isinstance(source, BlockArgument):  # back through af.rope/qk_norm/scale to q, k or v
        source = cast(Operation, source.owner).operands[0]
    rows = "Nq" if source.index == 0 else "Nk"
    shape = f"[B, {rows}]" if spec.ndim == 2 else f"[{rows}]"
    why = f"af.rope positions of {x.name}: {shape}, one per row of {x.name}"
    if spec.ndim == 2:
        extra.require_dim(0, "eq", "B", why)
    extra.require_dim(spec.ndim - 1, "eq", rows, why)
    return extra.value


def rope(
    x: TensorProxy,
    theta: float = 10000.0,
    style: str = "half",
    rotary_dim: int | None = None,
    scaling: object = None,
    inv_freq: object = None,
    positions: object = None,
) -> TensorProxy:
    """Rotary position embedding of q or k: rotate channel pairs of the first
    `rotary_dim` (default: all) channels by pos * inv_freq[i], inv_freq[i] =
    theta^(-2i/rotary_dim). `style` "half" pairs i with i + rotary_dim/2 (GPT-NeoX,
    Llama), "interleaved" pairs 2i with 2i+1 (GPT-J). `scaling` changes the
    frequencies (see `rope_scaling`); `inv_freq` gives them explicitly as a float
    tensor [rotary_dim / 2] argument of the variant.

    `pos` is the position of each of x's N rows. By default it is the row's place in
    the sequence: k's row j has position j, and q's row i position Nk - Nq + i (the
    queries are the last Nq of Nk tokens, as with a KV cache). `positions` gives it
    explicitly: an integer tensor (torch.int32 or torch.int64) argument of the variant,
    [B, N] (row n of batch entry b has position positions[b, n], Hugging Face's
    `position_ids`: left-padded or packed batches) or [N] (the same for every batch
    entry), N being x's length (Nq for q, Nk for k). Positions may be negative (they
    rotate backwards). They change only the rotation: masks, biases and the `q_idx` /
    `kv_idx` of custom functions keep the row-index convention above. q and k take
    their positions separately (pass the same tensor to both when Nq == Nk)."""
    t = _tracer("af.rope")
    x = _unquantized(_tensor(x, "af.rope"), "af.rope")
    r = x.head_dim if rotary_dim is None else _rotary_dim(rotary_dim, x)
    if style not in attn.RopeOp.STYLES:
        raise AttnFuseError(f"af.rope style must be 'half' or 'interleaved', got {style!r}")
    attr = rope_scaling(scaling)
    freq = None
    if inv_freq is not None:
        if attr is not None:
            raise AttnFuseError("af.rope takes either scaling= or inv_freq=, not both")
        extra = _extra_arg(inv_freq, "af.rope inv_freq")._extra
        extra.require_static((r // 2,), "af.rope inv_freq (rotary_dim / 2 frequencies)")
        freq = extra.value
    base = _real(theta, "af.rope theta", "positive")
    if attr is not None and attr.kind.data == "yarn" and base <= 1:
        raise AttnFuseError(
            f"af.rope theta must be > 1 with yarn scaling (YaRN's correction range divides by ln(theta)), got {base}"
        )
    pos = None if positions is None else _positions(positions, x)
    op = attn.RopeOp(x.value, theta=base, style=style, rotary_dim=r, scaling=attr, inv_freq=freq, positions=pos)
    op.output.name_hint = f"{x.name}_rope"
    return TensorProxy(t.emit(op, "af.rope"), x.name, x.heads, x.head_dim, x.dtype)


def qk_norm(x: TensorProxy, weight: object = None, eps: float = 1e-6) -> TensorProxy:
    """RMS normalisation of q or k over the head dim, times an optional float weight
    [D] (an argument of the variant): x * rsqrt(mean(x^2) + eps) * weight."""
    t = _tracer("af.qk_norm")
    x = _unquantized(_tensor(x, "af.qk_norm"), "af.qk_norm")
    w = None
    if weight is not None:
        extra = _extra_arg(weight, "af.qk_norm weight")._extra
        extra.require_static((x.head_dim,), f"af.qk_norm weight of {x.name} (its head dim)")
        w = extra.value
    op = attn.NormOp(x.value, w, _real(eps, "af.qk_norm eps", "positive"))
    op.output.name_hint = f"{x.name}_norm"
    return TensorProxy(t.emit(op, "af.qk_norm"), x.name, x.heads, x.head_dim, x.dtype)


def scale(x: TensorProxy | ScoresProxy, c: float) -> Any:
    """Multiply q or k (before af.qk) or the scores (after it) by the constant `c`."""
    t = _tracer("af.scale")
    value = _real(c, "af.scale c")
    if isinstance(x, ScoresProxy):
        op = attn.ScaleOp(x.value, value)
        op.output.name_hint = "s"
        return ScoresProxy(t.emit(op, "af.scale"), x.heads)
    x = _unquantized(_tensor(x, "af.scale"), "af.scale")
    op = attn.ScaleOp(x.value, value)
    op.output.name_hint = f"{x.name}_scale"
    return TensorProxy(t.emit(op, "af.scale"), x.name, x.heads, x.head_dim, x.dtype)


def _seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**63:
        raise AttnFuseError(f"af.hadamard seed must be an integer in [0, 2**63), got {_show(seed)}")
    return int(seed)


def hadamard(x: TensorProxy, seed: int = 0) -> TensorProxy:
    """Incoherent processing for low precision: x @ M over the head dim (a power of two), M the
    Hadamard matrix with random signs drawn from `seed` over sqrt(head dim)
    (`attnfuse.low_precision.hadamard_matrix`). M is orthogonal: the same rotation on q and k
    (required) leaves the scores unchanged and spreads outlier channels before quantization."""
    t = _tracer("af.hadamard")
    x = _unquantized(_tensor(x, "af.hadamard"), "af.hadamard")
    op = attn.HadamardOp(x.value, _seed(seed))
    op.output.name_hint = f"{x.name}_had"
    return TensorProxy(t.emit(op, "af.hadamard"), x.name, x.heads, x.head_dim, x.dtype)


def quantize_fp8(x: TensorProxy, block: int | None = None) -> TensorProxy:
    """q, k or v as float8 e4m3 holds it (the FP8 form, forward only): one scale per `block`
    consecutive rows of a (batch, head), or per tensor with `block=None`; each scale is the
    block's largest magnitude over 448 (e4m3's largest). The last transform before af.qk or
    af.pv. The kernels quantize q and k together (both or neither; v as chosen), each in its
    own kernel with its other transforms, before the attention multiplies the e4m3 values."""
    t = _tracer("af.quantize_fp8")
    x = _unquantized(_tensor(x, "af.quantize_fp8"), "af.quantize_fp8")
    rows = 0
    if block is not None:
        if isinstance(block, bool) or not isinstance(block, numbers.Integral) or int(block) < 1:
            raise AttnFuseError(f"af.quantize_fp8 block must be a positive number of rows or None, got {_show(block)}")
        rows = int(block)
    op = attn.QuantizeOp(x.value, rows)
    op.output.name_hint = f"{x.name}8"
    return TensorProxy(t.emit(op, "af.quantize_fp8"), x.name, x.heads, x.head_dim, x.dtype)


def _unquantized(x: TensorProxy, what: str) -> TensorProxy:
    if isinstance(x.value.owner, attn.QuantizeOp):
        raise AttnFuseError(
            f"{what}: {x.name} was already quantized by af.quantize_fp8, which must be its last transform "
            "before af.qk or af.pv"
        )
    return x


def qk(q: TensorProxy, k: TensorProxy, scale: float | None = None) -> ScoresProxy:
    """Scores q . k^T * scale (default 1/sqrt(head dim)); with GQA query head h reads
    kv head h // (Hq / Hkv)."""
    t = _tracer("af.qk")
    q, k = _tensor(q, "af.qk q"), _tensor(k, "af.qk k")
    op = attn.QKOp(q.value, k.value, None if scale is None else _real(scale, "af.qk scale", "positive"))
    op.scores.name_hint = "s"
    return ScoresProxy(t.emit(op, "af.qk"), q.heads)


def mask(s: ScoresProxy, pred: object) -> ScoresProxy:
    """Keep a score where `pred(b, h, q_idx, kv_idx)` holds, else -inf. Masks compose:
    every mask applied must hold."""
    t = _tracer("af.mask")
    s = _scores(s, "af.mask")
    for p in _as_predicate(pred).conjuncts():
        if isinstance(p, NamedMask):
            extras = []
            if p.extra is not None:
                ids = p.extra._extra
                if ids.spec.ndim != 2 or ids.spec.dtype not in (torch.int32, torch.int64):
                    raise AttnFuseError(
                        f"af.document ids ({ids.name}) must be an integer tensor [B, Nk] (torch.int32 or "
                        f"torch.int64), got a {ids.spec.ndim}-d {ids.spec.dtype} tensor"
                    )
                ids.require_dim(0, "eq", "B", "document ids [B, Nk]")
                ids.require_dim(1, "eq", "Nk", "document ids [B, Nk]")
                extras = [ids.value]
            op: Operation = attn.MaskOp(s.value, p.kind, p.param, extras)
        else:
            fn = p.fn if isinstance(p, CustomMask) else p
            region, used = t.trace_region(fn, f"af.mask predicate {p!r}", "mask")
            op = attn.MaskOp(s.value, "custom", None, [e.value for e in used], region)
        op.results[0].name_hint = "s"
        s = ScoresProxy(t.emit(op, "af.mask"), s.heads)
    return s


def bias(s: ScoresProxy, b: object) -> ScoresProxy:
    """Add `b(b, h, q_idx, kv_idx)` to each score: af.alibi(slopes) or a callable."""
    t = _tracer("af.bias")
    s = _scores(s, "af.bias")
    if isinstance(b, _Alibi):
        extra = b.slopes._extra
        extra.require_static((s.heads,), "af.alibi slopes (one per query head)")
        op: Operation = attn.BiasOp(s.value, "alibi", [extra.value])
    elif callable(b) and not isinstance(b, _Proxy):
        name = getattr(b, "__name__", "bias")
        region, used = t.trace_region(b, f"af.bias function {name}", "bias")
        op = attn.BiasOp(s.value, "custom", [e.value for e in used], region)
    else:
        raise AttnFuseError(
            f"af.bias expects af.alibi(slopes) or a callable fn(b, h, q_idx, kv_idx), got {_describe(b)}"
        )
    op.results[0].name_hint = "s"
    return ScoresProxy(t.emit(op, "af.bias"), s.heads)


def softcap(s: ScoresProxy, cap: float) -> ScoresProxy:
    """cap * tanh(s / cap) (Gemma 2, Grok)."""
    t = _tracer("af.softcap")
    s = _scores(s, "af.softcap")
    op = attn.SoftcapOp(s.value, _real(cap, "af.softcap cap", "positive"))
    op.output.name_hint = "s"
    return ScoresProxy(t.emit(op, "af.softcap"), s.heads)


def score_mod(s: ScoresProxy, fn: Callable[..., Any]) -> ScoresProxy:
    """Replace each score by fn(score, b, h, q_idx, kv_idx) (flex_attention's score_mod)."""
    t = _tracer("af.score_mod")
    s = _scores(s, "af.score_mod")
    name = getattr(fn, "__name__", "score_mod")
    region, used = t.trace_region(fn, f"af.score_mod function {name}", "score_mod")
    op = attn.ScoreModOp(s.value, [e.value for e in used], region)
    op.output.name_hint = "s"
    return ScoresProxy(t.emit(op, "af.score_mod"), s.heads)


def softmax(s: ScoresProxy, sink: object = None) -> ProbsProxy:
    """Row softmax; a `sink` (float tensor [Hq], an argument of the variant) adds
    exp(sink[h]) to each row's normaliser (gpt-oss)."""
    t = _tracer("af.softmax")
    s = _scores(s, "af.softmax")
    value = None
    if sink is not None:
        extra = _extra_arg(sink, "af.softmax sink")._extra
        extra.require_static((s.heads,), "af.softmax sink (one logit per query head)")
        value = extra.value
    op = attn.SoftmaxOp(s.value, value)
    op.output.name_hint = "p"
    return ProbsProxy(t.emit(op, "af.softmax"), s.heads)


def pv(p: ProbsProxy, v: TensorProxy) -> TensorProxy:
    """out = p . v: [B, Hq, Nq, Dv] in q's dtype; return it from the variant."""
    t = _tracer("af.pv")
    if not isinstance(p, ProbsProxy):
        raise AttnFuseError(f"af.pv expects the result of af.softmax, got {_describe(p)}")
    v = _tensor(v, "af.pv v")
    out_type = TensorType(ELEMENT_TYPES[t.out_dtype], [DYNAMIC_INDEX, p.heads, DYNAMIC_INDEX, v.head_dim])
    op = attn.PVOp(p.value, v.value, out_type)
    op.output.name_hint = "o"
    return TensorProxy(t.emit(op, "af.pv"), "out", p.heads, v.head_dim, t.out_dtype, is_output=True)
