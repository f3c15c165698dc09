"""The eager twin of `attnfuse::attention` (`attnfuse.autograd`): a call outside torch.compile
that needs a gradient is recorded by `AttnFuseAttention`, a `torch.autograd.Function` with the
op's target, saved tensors and backward, without the custom ops' Python dispatch (about 140 µs
per forward and backward on a slow host). Its gradients refuse a second backward, as the
backward op does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnfuse.autograd import OpTarget, _double_backward

Tensor = torch.Tensor


class AttnFuseAttention(torch.autograd.Function):
    """The eager twin of `attnfuse::attention`: the same target, saved tensors and backward,
    without the custom ops' Python dispatch, which costs about 140 µs per forward and
    backward on a slow host (the ops remain what torch.compile traces)."""

    @staticmethod
    def forward(ctx: Any, target: OpTarget, q: Tensor, k: Tensor, v: Tensor, *extras: Tensor) -> Any:
        out, lse = target.forward(q, k, v, extras)
        ctx.target, ctx.n_extras = target, len(extras)
        ctx.save_for_backward(q, k, v, *extras, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, dout: Tensor, dlse: Tensor | None) -> Any:
        q, k, v, *rest = ctx.saved_tensors
        extras, out, lse = rest[: ctx.n_extras], rest[-2], rest[-1]
        flags = ctx.needs_input_grad[1:]
        wrt = [i for i, needed in enumerate(flags) if needed]
        grads: list[Tensor | None] = [None] * len(flags)
        if wrt:
            computed = ctx.target.backward(wrt, q, k, v, extras, out, lse, dout)
            if torch.is_grad_enabled():  # create_graph: the gradients refuse a second backward
                anchor = torch.zeros((), device=dout.device, requires_grad=True)  # so they have a grad_fn
                computed = _OnceDifferentiable.apply(anchor, *computed)
            for i, g in zip(wrt, computed, strict=True):
                grads[i] = g
        return (None, *grads)


class _OnceDifferentiable(torch.autograd.Function):
    """Gradients that raise `AttnFuseError` when differentiated again."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor, *grads: Tensor) -> Any:
        return tuple(g.view_as(g) for g in grads)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        return _double_backward(ctx, *grads)


def eager_attention(
    target: OpTarget, q: Tensor, k: Tensor, v: Tensor, extras: Sequence[Tensor]
) -> tuple[Tensor, Tensor]:
    """(out, lse) of `target`, recorded by autograd (outside torch.compile)."""
    return AttnFuseAttention.apply(target, q, k, v, *extras)
