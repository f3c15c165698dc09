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

_SIZE_NAMES = {"B": "the batch size", "Hq": "q's head count", "Nq": "the query length", "Nk": "the kv length"}


def check_qkv(q: object, k: object, v: object) -> None:
    """Check q, k, v: tensors of rank 4, a supported shared dtype, one device,
    consistent batch, heads, head dims and kv lengths."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise AttnFuseError(f"{name} must be a torch.Tensor [B, H, N, D], got {type(t).__name__}")
        if t.dim() != 4:
            raise AttnFuseError(f"{name} must have rank 4 [B, H, N, D], got shape {list(t.shape)}")
        if t.shape[1] == 0 or t.shape[3] == 0:
            what = "no heads (dim 1" if t.shape[1] == 0 else "head dim 0 (dim 3"
            raise AttnFuseError(
                f"{name} has {what} of [B, H, N, D]), shape {list(t.shape)}; attention needs at least one "
                f"head of at least one channel"
            )
        if t.dtype not in dsl.QKV_DTYPES:
            raise AttnFuseError(f"{name} has dtype {t.dtype}; expected torch.float16, torch.bfloat16 or torch.float32")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise AttnFuseError(f"{name} has dtype {t.dtype} but q has {q.dtype}: q, k and v must share a dtype")
        if t.device != q.device:
            raise AttnFuseError(f"{name} is on {t.device} but q is on {q.device}: all tensors must be on one device")
        if t.shape[0] != q.shape[0]:
            raise AttnFuseError(f"{name} has batch size {t.shape[0]} but q has {q.shape[0]} (dim 0 of [B, H, N, D])")
    if k.shape[3] != q.shape[3]:
        raise AttnFuseError(f"k has head dim {k.shape[3]} but q has {q.shape[3]}: q and k must share the head dim")
    if v.shape[1] != k.shape[1]:
        raise AttnFuseError(f"v has {v.shape[1]} heads but k has {k.shape[1]}: k and v must share the head count")
    if v.shape[2] != k.shape[2]:
        raise AttnFuseError(
            f"v has {v.shape[2]} kv positions (dim 2) but k has {k.shape[2]}: k and v must have the same length"
        )
    if q.shape[1] % k.shape[1]:
        raise AttnFuseError(
            f"q has {q.shape[1]} heads, which is not a multiple of k's {k.shape[1]} heads (GQA needs Hq % Hkv == 0)"
        )


def check_extra_values(names: Sequence[str], q: torch.Tensor, extras: Sequence[object]) -> None:
    """Extra arguments are tensors of a supported dtype on q's device, or hashable
    constants."""
    for name, x in zip(names, extras, strict=True):
        if isinstance(x, torch.Tensor):
            if x.dtype not in dsl.ELEMENT_TYPES:
                raise AttnFuseError(
                    f"{name} has dtype {x.dtype}; extra tensors must be float16, bfloat16, float32, "
                    f"int32, int64 or bool"
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
