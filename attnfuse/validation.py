"""Validation of a variant call's inputs: q, k and v, the extra tensors a trace needs, and
the relations between them, each failure an `AttnFuseError` naming the argument and what
was expected. The runtime runs the full checks on its slow path and, on the hot path, the
few relations a signature tuple cannot hold (`extras_check`, `with_length_check`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from xdsl.ir import BlockArgument

from attnfuse import dsl
from attnfuse.dialects import attn
from attnfuse.errors import AttnFuseError

QKV_DTYPES = (*dsl.QKV_DTYPES, torch.float64)
"""dtypes q, k and v may have: the traced ones (`dsl.QKV_DTYPES`) and float64, which the
reference backend runs (traced as float32, computed in float64) and the kernels refuse."""

_SIZE_NAMES = {"B": "the batch size", "Hq": "q's head count", "Nq": "the query length", "Nk": "the kv length"}


LAYOUTS = ("bhnd", "bnhd")
"""The layouts a variant call takes (`layout=`): "bhnd", tensors [B, H, N, D] (the default),
or "bnhd", tensors [B, N, H, D] (FlashAttention's and Hugging Face's own layout), read
through transposed views at no cost."""

_LAYOUT_SHAPES = {"bhnd": "[B, H, N, D]", "bnhd": "[B, N, H, D]"}
_LAYOUT_DIMS = {"bhnd": (0, 1, 2, 3), "bnhd": (0, 2, 1, 3)}  # where B, H, N, D are


def check_layout(layout: object) -> str:
    """`layout` if it is one of `LAYOUTS`, else an `AttnFuseError` listing them."""
    if layout not in LAYOUTS:
        raise AttnFuseError(
            f"layout must be 'bhnd' (tensors [B, H, N, D], the default) or 'bnhd' (tensors [B, N, H, D]), "
            f"got {layout!r}"
        )
    return layout  # type: ignore[return-value]


def _other_layout_hint(layout: str) -> str:
    """What to pass when the tensors are in the other layout."""
    other = "bnhd" if layout == "bhnd" else "bhnd"
    return f"if your tensors are {_LAYOUT_SHAPES[other]}, pass layout='{other}'"


def _check_tensor(name: str, t: object, layout: str) -> None:
    """One of q, k, v: a tensor of rank 4 with heads and channels, of a q/k/v dtype."""
    shape = _LAYOUT_SHAPES[layout]
    if not isinstance(t, torch.Tensor):
        raise AttnFuseError(f"{name} must be a torch.Tensor {shape}, got {type(t).__name__}")
    if t.dim() != 4:
        raise AttnFuseError(f"{name} must have rank 4 {shape}, got shape {list(t.shape)}")
    _, h, _, d = _LAYOUT_DIMS[layout]
    if t.shape[h] == 0 or t.shape[d] == 0:
        what = f"no heads (dim {h}" if t.shape[h] == 0 else f"head dim 0 (dim {d}"
        raise AttnFuseError(
            f"{name} has {what} of {shape}), shape {list(t.shape)}; attention needs at least one "
            f"head of at least one channel"
        )
    if t.dtype not in QKV_DTYPES:
        raise AttnFuseError(
            f"{name} has dtype {t.dtype}; expected torch.float16, torch.bfloat16 or torch.float32 "
            f"(or torch.float64 on the reference backend)"
        )


def check_qkv(q: object, k: object, v: object, layout: str = "bhnd") -> None:
    """Check q, k, v: tensors of rank 4 in `layout` ([B, H, N, D] or [B, N, H, D]), a
    supported shared dtype, one device, consistent batch, heads, head dims and kv lengths.
    Errors name dims and shapes as the caller passed them."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, layout)
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    shape, (_, h, n, d) = _LAYOUT_SHAPES[layout], _LAYOUT_DIMS[layout]
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise AttnFuseError(f"{name} has dtype {t.dtype} but q has {q.dtype}: q, k and v must share a dtype")
        if t.device != q.device:
            raise AttnFuseError(f"{name} is on {t.device} but q is on {q.device}: all tensors must be on one device")
        if t.shape[0] != q.shape[0]:
            raise AttnFuseError(f"{name} has batch size {t.shape[0]} but q has {q.shape[0]} (dim 0 of {shape})")
    if k.shape[d] != q.shape[d]:
        raise AttnFuseError(f"k has head dim {k.shape[d]} but q has {q.shape[d]}: q and k must share the head dim")
    if v.shape[h] != k.shape[h]:
        raise AttnFuseError(
            f"v has {v.shape[h]} heads but k has {k.shape[h]}: k and v must share the head count (dim {h} of "
            f"{shape}, layout='{layout}'; {_other_layout_hint(layout)})"
        )
    if v.shape[n] != k.shape[n]:
        raise AttnFuseError(
            f"v has {v.shape[n]} kv positions (dim {n}) but k has {k.shape[n]}: k and v must have the same length"
        )
    if q.shape[h] % k.shape[h]:
        raise AttnFuseError(
            f"q has {q.shape[h]} heads, which is not a multiple of k's {k.shape[h]} heads (GQA needs Hq % Hkv == 0; "
            f"heads are dim {h} of {shape}, layout='{layout}'; {_other_layout_hint(layout)})"
        )


def check_extra_values(names: Sequence[str], q: torch.Tensor, extras: Sequence[object]) -> None:
    """Extra arguments are tensors of a supported dtype on q's device, or hashable
    constants."""
    for name, x in zip(names, extras, strict=True):
        if isinstance(x, torch.Tensor):
            if x.dtype not in dsl.ELEMENT_TYPES and not (x.dtype == torch.float64 == q.dtype):
                raise AttnFuseError(
                    f"{name} has dtype {x.dtype}; extra tensors must be float16, bfloat16, float32, "
                    f"int32, int64 or bool (or float64 in a float64 call)"
                )
            if x.device != q.device:
                raise AttnFuseError(
                    f"{name} is on {x.device} but q is on {q.device}: all tensors must be on one device"
                )
        else:
            try:
                hash(x)
            except TypeError:
                raise AttnFuseError(
                    f"{name} must be a tensor or a hashable constant (it is traced into the IR), "
                    f"got a {type(x).__name__}"
                ) from None


def _tensor_specs(trace: dsl.Trace, n_given: int) -> list[tuple[int, dsl.ExtraSpec]]:
    """(index among the given extras, spec) of each given extra tensor."""
    return [(spec.position - 3, spec) for spec in trace.extras if spec is not None and spec.position - 3 < n_given]


def validate_extras(trace: dsl.Trace, q: torch.Tensor, k: torch.Tensor, extras: Sequence[object]) -> None:
    """Check the given extra tensors against what the traced IR needs (device, shape),
    raising `AttnFuseError` naming the argument and the expected size: e.g. document
    ids [B, Nk], RoPE positions [B, N] or [N] with N the length of the tensor they
    rotate (Nq for q, Nk for k)."""
    sizes = {"B": q.shape[0], "Hq": q.shape[1], "Nq": q.shape[2], "Nk": k.shape[2]}
    for i, spec in _tensor_specs(trace, len(extras)):
        x = extras[i]
        assert isinstance(x, torch.Tensor)
        if x.device != q.device:
            raise AttnFuseError(
                f"{spec.name} is on {x.device} but q is on {q.device}: all tensors must be on one device"
            )
        shape = x.shape
        if spec.static_shape is not None and shape != spec.static_shape:
            raise AttnFuseError(
                f"{spec.name} ({spec.static_reason}) must have shape {list(spec.static_shape)}, got {list(shape)}"
            )
        for dim, rel, size, why in spec.dim_reqs:
            n = size if isinstance(size, int) else sizes[size]
            if (shape[dim] != n) if rel == "eq" else (shape[dim] < n):
                what = f"{n}" if isinstance(size, int) else f"{n} ({_SIZE_NAMES[size]})"
                raise AttnFuseError(
                    f"{spec.name} must have {'size' if rel == 'eq' else 'at least size'} {what} in dim {dim} "
                    f"({why}), got shape {list(shape)}"
                )


_QKV_NAMES = ("q", "k", "v")
_LENGTH_ROLES: dict[str, tuple[int, int] | None] = {}


def _length_roles(trace: dsl.Trace) -> tuple[int, int] | None:
    """(index among q, k, v of the tensor attn.qk reads as k, of the one attn.pv reads as
    v) when their lengths are not already checked equal (one of them is q); else None.
    Cached per traced IR."""
    if trace.text not in _LENGTH_ROLES:
        roles = None
        qk = next(op for op in trace.module.walk() if isinstance(op, attn.QKOp))
        pv = next(op for op in trace.module.walk() if isinstance(op, attn.PVOp))
        key = qk.k
        while not isinstance(key, BlockArgument):
            key = key.owner.operands[0]  # type: ignore[union-attr]  (a pre-matmul transform)
        if isinstance(pv.v, BlockArgument) and pv.v.index != key.index and 0 in (pv.v.index, key.index):
            roles = (key.index, pv.v.index)
        _LENGTH_ROLES[trace.text] = roles
    return _LENGTH_ROLES[trace.text]


def check_pv_length(trace: dsl.Trace, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """af.pv's v must have as many rows as af.qk's k (each key has its value), whichever of
    q, k, v the variant passes them: nothing is launched otherwise."""
    roles = _length_roles(trace)
    if roles is None:
        return
    tensors = (q, k, v)
    key, value = roles
    nk, nv = tensors[key].shape[2], tensors[value].shape[2]
    if nk != nv:
        raise AttnFuseError(
            f"af.pv's v ({_QKV_NAMES[value]}) has {nv} positions (dim 2) but af.qk's k ({_QKV_NAMES[key]}) has "
            f"{nk}: v must have one row per key"
        )


def check_against_trace(
    trace: dsl.Trace, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extras: Sequence[object]
) -> None:
    """The checks that need the traced IR: the extra tensors' devices and shapes
    (`validate_extras`) and af.pv's v length (`check_pv_length`)."""
    validate_extras(trace, q, k, extras)
    check_pv_length(trace, q, k, v)


def with_length_check(
    trace: dsl.Trace, check: Callable[[torch.Tensor, torch.Tensor, Sequence[object]], bool] | None
) -> Callable[[torch.Tensor, torch.Tensor, Sequence[object]], bool] | None:
    """The hot path's `check`, also taking the slow path when `check_pv_length` would
    raise (k and v have one length there, so q's against k's decides)."""
    if _length_roles(trace) is None:
        return check
    if check is None:
        return lambda q, k, extras: q.shape[2] == k.shape[2]
    return lambda q, k, extras: q.shape[2] == k.shape[2] and check(q, k, extras)


_SIZE_INDEX = {"B": 0, "Hq": 1, "Nk": 2, "Nq": 3}


def extras_check(
    trace: dsl.Trace, n_given: int
) -> Callable[[torch.Tensor, torch.Tensor, Sequence[object]], bool] | None:
    """The hot path's version of `validate_extras`: True when the extras fit, False
    to take the slow path (which raises the precise error); None when there is
    nothing to check."""
    compiled = []
    for i, spec in _tensor_specs(trace, n_given):
        reqs = tuple(
            (dim, rel == "eq", -1, size) if isinstance(size, int) else (dim, rel == "eq", _SIZE_INDEX[size], 0)
            for dim, rel, size, _ in spec.dim_reqs
        )
        compiled.append((i, spec.static_shape, reqs))
    if not compiled:
        return None

    def check(q: torch.Tensor, k: torch.Tensor, extras: Sequence[object]) -> bool:
        device, sizes = q.device, None
        for i, static, reqs in compiled:
            x = extras[i]
            shape = x.shape  # type: ignore[attr-defined]
            if x.device != device or (static is not None and shape != static):  # type: ignore[attr-defined]
                return False
            for dim, eq, index, n in reqs:
                if index >= 0:
                    if sizes is None:
                        qs = q.shape
                        sizes = (qs[0], qs[1], k.shape[2], qs[2])
                    n = sizes[index]
                if (shape[dim] != n) if eq else (shape[dim] < n):
                    return False
        return True

    return check


def forward_only(trace: dsl.Trace) -> str:
    """Why the traced variant has no backward (the FP8 form's ops), or "" when it may have one."""
    ops = [op.name for op in trace.module.walk() if isinstance(op, attn.LOW_PRECISION_OPS)]
    if not ops:
        return ""
    return (
        f"the FP8 form ({ops[0]}) is forward-only (inference) and has no backward, but an input requires grad; "
        "call it under torch.no_grad() or with inputs that do not require grad"
    )
