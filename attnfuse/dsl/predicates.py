"""Mask predicates and score biases: what `af.mask` and `af.bias` accept.

Named predicates (`causal`, `sliding_window(w)`, `prefix_lm(n)`, `document(ids)`)
become named `attn.mask` forms, which `causal-split` recognises; a conjunction `p & q`
becomes one mask per conjunct; `p | q`, `~p` and Python callables become custom
regions. A predicate is also callable on traced (b, h, q_idx, kv_idx), so that it can be
combined inside a custom one. Biases are `alibi(slopes)` or Python callables.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from attnfuse.dsl.scalars import _I32_MAX, _describe, _Proxy, _show
from attnfuse.dsl.tracing import ExtraProxy
from attnfuse.errors import AttnFuseError

# --------------------------------------------------------------------------- predicates and biases


class MaskPredicate:
    """A mask predicate: `af.causal`, `af.sliding_window(w)`, `af.prefix_lm(n)`,
    `af.document(ids)`, a conjunction `p & q`, or a custom `fn(b, h, q_idx, kv_idx)`.

    Named predicates become named `attn.mask` forms (which `causal-split` recognises);
    `p & q` applies both masks; `p | q` and `~p` become custom regions. A predicate is
    also callable on traced (b, h, q_idx, kv_idx), to be combined inside a custom one."""

    def conjuncts(self) -> list[MaskPredicate]:
        return [self]

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        raise NotImplementedError

    def __and__(self, other: object) -> MaskPredicate:
        return _AllOf([*self.conjuncts(), *_as_predicate(other).conjuncts()])

    def __rand__(self, other: object) -> MaskPredicate:
        return _AllOf([*_as_predicate(other).conjuncts(), *self.conjuncts()])

    def __or__(self, other: object) -> MaskPredicate:
        o = _as_predicate(other)
        return CustomMask(lambda b, h, q, kv: self(b, h, q, kv) | o(b, h, q, kv), f"({self} | {o})")

    def __ror__(self, other: object) -> MaskPredicate:
        return _as_predicate(other) | self

    def __invert__(self) -> MaskPredicate:
        return CustomMask(lambda b, h, q, kv: ~self(b, h, q, kv), f"~{self}")


class NamedMask(MaskPredicate):
    """One of the named `attn.mask` forms."""

    def __init__(self, kind: str, param: int | None = None, extra: ExtraProxy | None = None):
        self.kind, self.param, self.extra = kind, param, extra

    def __repr__(self) -> str:
        if self.kind == "causal":
            return "af.causal"
        arg = self.param if self.extra is None else self.extra._extra.name
        return f"af.{self.kind}({arg})"

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if self.kind == "causal":
            return kv_idx <= q_idx
        if self.kind == "sliding_window":
            d = q_idx - kv_idx
            return (d >= 0) & (d < self.param)
        if self.kind == "prefix_lm":
            return (kv_idx < self.param) | (kv_idx <= q_idx)
        assert self.extra is not None
        return self.extra[b, q_idx] == self.extra[b, kv_idx]


class CustomMask(MaskPredicate):
    """A Python predicate traced into a `custom` `attn.mask` region."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "predicate")

    def __repr__(self) -> str:
        return self.name

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return self.fn(b, h, q_idx, kv_idx)


class _AllOf(MaskPredicate):
    def __init__(self, preds: list[MaskPredicate]):
        self.preds = preds

    def __repr__(self) -> str:
        return " & ".join(map(repr, self.preds))

    def conjuncts(self) -> list[MaskPredicate]:
        return list(self.preds)

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        result = self.preds[0](b, h, q_idx, kv_idx)
        for p in self.preds[1:]:
            result = result & p(b, h, q_idx, kv_idx)
        return result


def _as_predicate(p: object) -> MaskPredicate:
    if isinstance(p, MaskPredicate):
        return p
    if callable(p) and not isinstance(p, _Proxy):
        return CustomMask(p)
    raise AttnFuseError(
        f"a mask predicate must be af.causal, af.sliding_window(w), af.prefix_lm(n), af.document(ids) "
        f"or a callable fn(b, h, q_idx, kv_idx) returning a boolean, got {_describe(p)}"
    )


def _position_param(x: object, what: str, minimum: int) -> int:
    """A mask's integer parameter, a number of positions: an int (not a bool) in
    [minimum, 2**31 - 1], since kernels compute positions in i32."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or not minimum <= int(x) <= _I32_MAX:
        raise AttnFuseError(
            f"{what} must be an integer in [{minimum}, {_I32_MAX}] (at most 2**31 - 1: kernels compute positions "
            f"in i32), got {_show(x)}"
        )
    return int(x)


def _extra_arg(x: object, what: str) -> ExtraProxy:
    if isinstance(x, ExtraProxy):
        return x
    if isinstance(x, torch.Tensor):
        raise AttnFuseError(
            f"{what} must be a tensor argument of the variant (passed at call time, like "
            f"variant(q, k, v, {what.split()[-1]})), not a tensor captured from outside"
        )
    raise AttnFuseError(f"{what} must be a tensor argument of the variant, got {_describe(x)}")


causal = NamedMask("causal")
"""Keep kv_pos <= q_pos."""


def sliding_window(w: int) -> MaskPredicate:
    """Keep 0 <= q_pos - kv_pos < w (a causal window of w tokens, the query's own included);
    1 <= w <= 2**31 - 1, and the largest window is plain causal attention."""
    return NamedMask("sliding_window", _position_param(w, "af.sliding_window(w)", 1))


def prefix_lm(n: int) -> MaskPredicate:
    """Keep kv_pos < n (the bidirectional prefix) or kv_pos <= q_pos; 0 <= n <= 2**31 - 1
    (n = 0 is plain causal attention)."""
    return NamedMask("prefix_lm", _position_param(n, "af.prefix_lm(n)", 0))


def document(ids: object) -> MaskPredicate:
    """Keep ids[b, q_pos] == ids[b, kv_pos]: packed documents attend only within
    themselves. `ids` is an integer tensor [B, Nk], an argument of the variant."""
    return NamedMask("document", extra=_extra_arg(ids, "af.document ids"))


class BiasFn:
    """A score bias: `af.alibi(slopes)` or a custom `fn(b, h, q_idx, kv_idx)`."""

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        raise NotImplementedError


class _Alibi(BiasFn):
    def __init__(self, slopes: ExtraProxy):
        self.slopes = slopes

    def __repr__(self) -> str:
        return f"af.alibi({self.slopes._extra.name})"

    def __call__(self, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return self.slopes[h] * (kv_idx - q_idx)


def alibi(slopes: object) -> BiasFn:
    """ALiBi: add slopes[h] * (kv_pos - q_pos); `slopes` is a float tensor [Hq], an
    argument of the variant (see `af.alibi_slopes`)."""
    return _Alibi(_extra_arg(slopes, "af.alibi slopes"))
