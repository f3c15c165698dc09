"""The KV loop's segments: which KV blocks a Q block visits, and which of them need mask
code, from causal-split's bounds (`#attn.kv_bound`).

A Q block skips the KV blocks no query of it may attend to; blocks where every
(query, key) pair is kept run without mask code (full); the others are masked
(partial). FlashAttention-2's causal split, generalised to sliding windows, prefix-LM
and their conjunctions.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects.builtin import ArrayAttr
from xdsl.ir import SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects.attn import KvBoundAttr
from attnfuse.passes.analysis import AttentionChains
from attnfuse.passes.tl_builder import KernelBuilder

KvRange = tuple[SSAValue | int, SSAValue, SSAValue | int, SSAValue]
"""(v_lo, v_hi, f_lo, f_hi): the keys some query of a Q block may keep are [v_lo, v_hi),
the keys every query of it keeps are [f_lo, f_hi); 0 is a bound known statically."""


def _causal_range(kb: KernelBuilder, q_lo: SSAValue, q_hi: SSAValue, n: int) -> KvRange:
    """kv_pos <= q_pos."""
    v_hi, f_hi = kb.add(q_hi, 1), kb.add(q_lo, 1)
    return 0, v_hi, 0, f_hi


def _sliding_window_range(kb: KernelBuilder, q_lo: SSAValue, q_hi: SSAValue, w: int) -> KvRange:
    """0 <= q_pos - kv_pos < w."""
    v_lo, v_hi = kb.sub(q_lo, w - 1), kb.add(q_hi, 1)
    f_lo, f_hi = kb.sub(q_hi, w - 1), kb.add(q_lo, 1)
    return v_lo, v_hi, f_lo, f_hi


def _prefix_lm_range(kb: KernelBuilder, q_lo: SSAValue, q_hi: SSAValue, n: int) -> KvRange:
    """kv_pos < n or kv_pos <= q_pos."""
    v_hi, f_hi = kb.maximum(kb.add(q_hi, 1), n), kb.maximum(kb.add(q_lo, 1), n)
    return 0, v_hi, 0, f_hi


KV_RANGES: dict[str, Callable[[KernelBuilder, SSAValue, SSAValue, int], KvRange]] = {
    "causal": _causal_range,
    "sliding_window": _sliding_window_range,
    "prefix_lm": _prefix_lm_range,
}
"""The KV range of each KV-bounded mask kind (`attn.MaskKind.kv_bounded`), given the Q
block's first and last query positions and the kind's parameter."""


def kv_bounds(chains: AttentionChains) -> list[KvBoundAttr]:
    """causal-split's `attn.kv_blocks`; without it every mask is opaque."""
    kv_blocks = chains.func.attributes.get("attn.kv_blocks")
    if kv_blocks is None:
        return [KvBoundAttr(KvBoundAttr.OPAQUE)] * len(chains.masks)
    if not isinstance(kv_blocks, ArrayAttr) or not all(isinstance(b, KvBoundAttr) for b in kv_blocks.data):
        raise DiagnosticException(
            f"func @{chains.func.sym_name.data} attribute attn.kv_blocks must be a list of #attn.kv_bound<...>, "
            f"got {kv_blocks}"
        )
    return [b for b in kv_blocks.data if isinstance(b, KvBoundAttr)]


def kv_segments(
    kb: KernelBuilder, bounds: list[KvBoundAttr], q_lo: SSAValue, q_hi: SSAValue, nk: SSAValue, bn: int
) -> list[tuple[SSAValue, SSAValue, bool]]:
    """[(lo, hi, masked)]: the KV ranges, in blocks of `bn` keys, that the Q block of
    positions [q_lo, q_hi] visits, in order. The ranges of the bounds (`KV_RANGES`)
    intersect, as their masks conjoin; with an opaque bound every visited block is masked."""
    vlo: SSAValue | int = 0
    vhi: SSAValue = nk
    flo: SSAValue | int = 0
    fhi: SSAValue = nk
    opaque = False
    for bound in bounds:
        kind = bound.mask_kind
        if kind is None:
            opaque = True
            continue
        v_lo, v_hi, f_lo, f_hi = KV_RANGES[kind.name](kb, q_lo, q_hi, bound.param_value)
        vlo = vlo if v_lo == 0 else kb.maximum(vlo, v_lo)
        flo = flo if f_lo == 0 else kb.maximum(flo, f_lo)
        vhi, fhi = kb.minimum(vhi, v_hi), kb.minimum(fhi, f_hi)
    lo = kb.mul(kb.floordiv(vlo, bn), bn, hint="kv_lo") if not isinstance(vlo, int) else kb.value(0)
    hi = vhi if vhi is nk else kb.maximum(vhi, 0, hint="kv_hi")
    if opaque:
        return [(lo, hi, True)]
    # Full blocks: [flo, fhi) rounded inwards to whole blocks, kept inside [lo, hi).
    if isinstance(flo, int):
        f_start = kb.minimum(lo, hi, hint="full_lo") if isinstance(vlo, SSAValue) else lo
    else:
        f_start = kb.minimum(kb.maximum(kb.mul(kb.cdiv(flo, bn), bn), lo), hi, hint="full_lo")
    f_end = kb.mul(kb.floordiv(kb.maximum(fhi, 0), bn), bn)
    f_end = kb.maximum(kb.minimum(f_end, hi), f_start, hint="full_hi")
    return [(lo, f_start, True), (f_start, f_end, False), (f_end, hi, True)]


# ----------------------------------------------------------------------------- the backward's Q loop

QRange = tuple[SSAValue | None, SSAValue | None, SSAValue | None, SSAValue | None]
"""(v_lo, v_hi, f_lo, f_hi) in query positions: the queries that may keep some key of a KV
block are [v_lo, v_hi), those that keep every key of it [f_lo, f_hi); None is unbounded."""


def _causal_q_range(kb: KernelBuilder, k_lo: SSAValue, k_hi: SSAValue, n: int) -> QRange:
    """kv_pos <= q_pos."""
    return k_lo, None, k_hi, None


def _sliding_window_q_range(kb: KernelBuilder, k_lo: SSAValue, k_hi: SSAValue, w: int) -> QRange:
    """0 <= q_pos - kv_pos < w."""
    return k_lo, kb.add(k_hi, w), k_hi, kb.add(k_lo, w)


def _prefix_lm_q_range(kb: KernelBuilder, k_lo: SSAValue, k_hi: SSAValue, n: int) -> QRange:
    """kv_pos < n or kv_pos <= q_pos: a block inside the prefix is seen by every query."""
    far = -(1 << 30)
    v_lo = kb.where(kb.cmp("<", k_lo, n), far, k_lo)
    f_lo = kb.where(kb.cmp("<", k_hi, n), far, k_hi)
    return v_lo, None, f_lo, None


Q_RANGES: dict[str, Callable[[KernelBuilder, SSAValue, SSAValue, int], QRange]] = {
    "causal": _causal_q_range,
    "sliding_window": _sliding_window_q_range,
    "prefix_lm": _prefix_lm_q_range,
}
"""The query range of each KV-bounded mask kind, given a KV block's first and last key
positions: the transpose of `KV_RANGES`, for the dK/dV kernel's loop over Q blocks."""


def q_segments(
    kb: KernelBuilder,
    bounds: list[KvBoundAttr],
    k_lo: SSAValue,
    k_hi: SSAValue,
    shift: SSAValue,
    nq: SSAValue,
    bm: int,
) -> list[tuple[SSAValue, SSAValue, bool]]:
    """[(lo, hi, masked)]: the query rows, in blocks of `bm` from row 0, that the KV block
    of positions [k_lo, k_hi] meets, in order (query row i has position i + `shift`)."""
    vlo: SSAValue | None = None
    vhi: SSAValue | None = None
    flo: SSAValue | None = None
    fhi: SSAValue | None = None
    opaque = False

    def tighter(a: SSAValue | None, b: SSAValue | None, pick) -> SSAValue | None:
        return b if a is None else a if b is None else pick(a, b)

    for bound in bounds:
        kind = bound.mask_kind
        if kind is None:
            opaque = True
            continue
        v_lo, v_hi, f_lo, f_hi = Q_RANGES[kind.name](kb, k_lo, k_hi, bound.param_value)
        vlo, flo = tighter(vlo, v_lo, kb.maximum), tighter(flo, f_lo, kb.maximum)
        vhi, fhi = tighter(vhi, v_hi, kb.minimum), tighter(fhi, f_hi, kb.minimum)

    def rows(pos: SSAValue | None, default: SSAValue | int) -> SSAValue | int:
        """A position bound as a row in [0, nq]."""
        if pos is None:
            return default
        return kb.minimum(kb.maximum(kb.sub(pos, shift), 0), nq)

    lo_row, hi = rows(vlo, 0), rows(vhi, nq)
    lo = kb.mul(kb.floordiv(lo_row, bm), bm, hint="q_lo") if not isinstance(lo_row, int) else kb.value(0)
    hi = kb.value(hi) if isinstance(hi, int) else hi
    if opaque or not bounds:
        return [(lo, hi, bool(bounds))]
    f_lo_row, f_hi_row = rows(flo, 0), rows(fhi, nq)
    f_start = kb.minimum(kb.maximum(kb.mul(kb.cdiv(f_lo_row, bm), bm), lo), hi, hint="full_q_lo")
    f_end = kb.mul(kb.floordiv(f_hi_row, bm), bm) if fhi is not None else hi
    f_end = kb.maximum(kb.minimum(f_end, hi), f_start, hint="full_q_hi")
    return [(lo, f_start, True), (f_start, f_end, False), (f_end, hi, True)]
