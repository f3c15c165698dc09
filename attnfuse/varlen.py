"""Packed sequences of different lengths (`Variant.varlen`): q, k, v packed as [total, H, D],
sequence s at tokens cu_seqlens[s] .. cu_seqlens[s + 1] - 1; each computed as the variant's
ordinary call on it alone (positions from 0 in each; fewer queries than keys are its last).

On the `triton` and `interpret` backends the forward and the backward are the generated varlen
kernels (`passes/varlen_to_tl.py`, kernel path `varlen`: the generic kernels with their programs
per sequence); on `reference` each sequence is the reference backend's ordinary call.
Extras indexed by token (RoPE positions, document ids) are refused: a packed batch would need
them per sequence.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, cast

import torch

from attnfuse import autograd, dsl, launch, validation
from attnfuse.errors import AttnFuseError
from attnfuse.inference import analyse_trace

if TYPE_CHECKING:
    from attnfuse.runtime import Variant


def _check_varlen_inputs(
    q: object, k: object, v: object, cu_q: object, cu_k: object, max_q: object, max_k: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]; cu_seqlens int32
    [S + 1] on their device; the max lengths non-negative integers."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise AttnFuseError(f"varlen: {name} must be a packed tensor [total, H, D], got {got}")
    q, k, v = cast(torch.Tensor, q), cast(torch.Tensor, k), cast(torch.Tensor, v)
    if q.dtype not in validation.QKV_DTYPES:
        raise AttnFuseError(f"varlen: q has dtype {q.dtype}; expected one of {list(validation.QKV_DTYPES)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise AttnFuseError(f"varlen: {name} is {t.dtype} on {t.device} but q is {q.dtype} on {q.device}")
    if k.shape[:2] != v.shape[:2]:
        raise AttnFuseError(f"varlen: k {list(k.shape)} and v {list(v.shape)} must agree in [total_k, Hkv]")
    if k.shape[2] != q.shape[2]:
        raise AttnFuseError(f"varlen: k has head dim {k.shape[2]} but q has {q.shape[2]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise AttnFuseError(f"varlen: q has {q.shape[1]} heads, not a multiple of k's {k.shape[1]}")
    _check_cu_seqlens(q, cu_q, cu_k, max_q, max_k)
    return q, k, v


def _check_cu_seqlens(q: torch.Tensor, cu_q: object, cu_k: object, max_q: object, max_k: object) -> None:
    """cu_seqlens int32 [S + 1] on q's device, as many for q as for k; max lengths non-negative ints."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1:
            raise AttnFuseError(f"varlen: {name} must be an int32 tensor [S + 1], got {cu!r:.80}")
        if cu.device != q.device:
            raise AttnFuseError(f"varlen: {name} is on {cu.device} but q is on {q.device}")
    if cast(torch.Tensor, cu_q).numel() != cast(torch.Tensor, cu_k).numel():
        raise AttnFuseError("varlen: cu_seqlens_q and cu_seqlens_k must hold the same number of sequences (S + 1)")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if _as_length(m) is None:
            raise AttnFuseError(f"varlen: {name} must be a non-negative int, got {m!r}")


def _check_varlen_values(
    cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int, max_q: int, max_k: int
) -> None:
    """Each cu_seqlens starts at 0, never decreases, ends at its total; every length is within
    its max: one device-to-host copy."""
    for name, cu, total, most in (("q", cu_q, total_q, max_q), ("k", cu_k, total_k, max_k)):
        values = cu.tolist()
        lengths = [b - a for a, b in zip(values, values[1:], strict=False)]
        if values[0] != 0 or values[-1] != total or any(n < 0 for n in lengths):
            raise AttnFuseError(
                f"varlen: cu_seqlens_{name} must start at 0, never decrease and end at the packed {name}'s "
                f"{total} tokens, got {values[:16]}{' ...' if len(values) > 16 else ''}"
            )
        if lengths and max(lengths) > most:
            raise AttnFuseError(f"varlen: a sequence has {max(lengths)} {name} tokens, past max_seqlen_{name} = {most}")


def varlen(
    variant: Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *extras: object,
    check: bool = True,
) -> torch.Tensor:
    """The variant on a batch of packed sequences: q [total_q, Hq, D], k [total_k, Hkv, D], v
    [total_k, Hkv, Dv]; sequence s holds tokens cu_seqlens[s] .. cu_seqlens[s + 1] - 1 (int32
    [S + 1]). Returns [total_q, Hq, Dv]: each sequence's ordinary call on it alone (positions from
    0 in each; with fewer queries than keys, its queries are its last positions). Differentiable.
    `check` (the default) checks the cu_seqlens against the totals and max lengths (one
    device-to-host copy)."""
    q, k, v = _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    max_seqlen_q, max_seqlen_k = cast(int, _as_length(max_seqlen_q)), cast(int, _as_length(max_seqlen_k))
    # The kernels index the offsets from their first element: a strided view is copied.
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    if check:
        _check_varlen_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    trace, full = variant._validated_trace(q4, k4, v4, extras)
    chains = analyse_trace(trace)
    from attnfuse.passes.varlen_to_tl import per_token_extras

    bad = per_token_extras(chains)
    if bad:
        raise AttnFuseError(
            f"{variant.__name__}.varlen takes no per-token extras ({', '.join(bad)}): positions restart at 0 in each "
            "packed sequence; call the variant per sequence for explicit positions or document ids"
        )
    mode = launch.kernel_mode(launch.current_backend(), q)
    if mode == "reference" or q.shape[0] == 0:
        out4 = _per_sequence(variant, q4, k4, v4, cu_seqlens_q, cu_seqlens_k, full)
    elif mode == "interpret" and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong
        ex32 = tuple(launch.as_float32(x) for x in extras)
        fq, fk, fv = (cast(torch.Tensor, launch.as_float32(t)) for t in (q, k, v))
        out = varlen(variant, fq, fk, fv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *ex32, check=False)
        return out.to(torch.bfloat16)
    else:
        out4 = _kernel_varlen(
            variant, trace, mode, q4, k4, v4, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, full
        )
    return out4[0].transpose(0, 1)


def _per_sequence(variant: Variant, q4, k4, v4, cu_q: torch.Tensor, cu_k: torch.Tensor, full) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Each sequence's ordinary call (the reference backend), concatenated: [1, Hq, total_q, Dv]."""
    qs, ks = cu_q.tolist(), cu_k.tolist()
    parts = [
        variant(q4[:, :, a:b], k4[:, :, c:d], v4[:, :, c:d], *full)
        for a, b, c, d in zip(qs, qs[1:], ks, ks[1:], strict=False)
    ]
    if not parts:
        return q4.new_zeros((1, q4.shape[1], 0, v4.shape[3]))
    return torch.cat(parts, dim=2)


def _kernel_varlen(
    variant: Variant,
    trace: dsl.Trace,
    mode: str,
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    full: tuple[object, ...],
) -> torch.Tensor:
    """The varlen forward kernel, recorded by autograd when an input requires grad (its backward
    is the varlen backward kernels, compiled for the inputs requiring grad before the forward runs,
    so a gradient the compiler cannot form is an error here)."""
    if q4.dtype == torch.float64:
        raise AttnFuseError(
            f"varlen: q, k and v are float64, which the {mode} backend does not run; "
            "af.backend('reference') computes float64 calls in float64"
        )
    interpret = mode == "interpret"
    tensors = [x for x in full if isinstance(x, torch.Tensor)]
    _, run, spec = launch.load_kernel(trace, q4, k4, v4, interpret, varlen=True)
    inputs = (q4, k4, v4, *tensors)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):
        return run(q4, k4, v4, *tensors, cu_q, cu_k, max_q, lse=launch.lse_workspace(q4))[0]
    wrt = tuple(i for i, t in enumerate(inputs) if t.requires_grad)
    names = [*variant.arg_names[:3], *(n for n, x in zip(variant.arg_names[3:], full, strict=True) if _tensor(x))]
    target = autograd.KernelTarget(variant.__name__, names, trace, spec, run, float32=False)
    backward = target.backward_launch(wrt)

    def forward(*xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return run(*xs, cu_q, cu_k, max_q)

    def grads(*xs: torch.Tensor) -> list[torch.Tensor]:
        pos_q, pos_k = token_positions(cu_q, cu_k, q4.shape[2], k4.shape[2])
        return backward(*xs, cu_q, cu_k, max_q, max_k, pos_q, pos_k)

    return cast(torch.Tensor, _Varlen.apply(forward, grads, wrt, *inputs))


def _as_length(m: object) -> int | None:
    """A max length as a Python int (an int, a numpy integer, a one-element integer tensor), or
    None when it is none of these or negative."""
    if isinstance(m, bool) or (isinstance(m, torch.Tensor) and (m.numel() != 1 or m.is_floating_point())):
        return None
    try:
        n = operator.index(m.item() if isinstance(m, torch.Tensor) else m)  # type: ignore[arg-type]
    except TypeError:
        return None
    return n if n >= 0 else None


def _tensor(x: object) -> bool:
    return isinstance(x, torch.Tensor)


def token_positions(
    cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each packed token's position in its sequence, int32: keys 0.., queries the sequence's last
    positions (Nk - Nq + i). Computed on the device, without a host synchronisation."""
    lens_q, lens_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    seqs = torch.arange(lens_q.numel(), device=cu_q.device)
    seq_q = torch.repeat_interleave(seqs, lens_q, output_size=total_q)
    seq_k = torch.repeat_interleave(seqs, lens_k, output_size=total_k)
    pos_k = torch.arange(total_k, device=cu_k.device) - cu_k[:-1][seq_k]
    pos_q = torch.arange(total_q, device=cu_q.device) - cu_q[:-1][seq_q] + (lens_k - lens_q)[seq_q]
    return pos_q.to(torch.int32), pos_k.to(torch.int32)


class _Varlen(torch.autograd.Function):
    """The varlen forward kernel; backward: the varlen backward kernels (each sequence's rows as
    the ordinary backward's; gradients of shared extras such as QK-norm weights summed)."""

    @staticmethod
    def forward(ctx, forward, grads, wrt, *inputs):  # type: ignore[no-untyped-def, override]
        out, lse = forward(*inputs)
        ctx.grads, ctx.wrt = grads, wrt
        ctx.save_for_backward(out, lse, *inputs)
        ctx.mark_non_differentiable(lse)
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[no-untyped-def, override]
        out, lse, *inputs = ctx.saved_tensors
        found = ctx.grads(*inputs, out, lse, dout.contiguous())
        grads: list[torch.Tensor | None] = [None] * len(inputs)
        for i, g in zip(ctx.wrt, found, strict=True):
            grads[i] = g.to(inputs[i].dtype)
        return (None, None, None, *grads)
