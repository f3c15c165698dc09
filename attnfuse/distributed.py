"""Context parallelism: attention over a sequence sharded across the ranks of a
`torch.distributed` process group (NCCL on GPUs, gloo on CPU).

A sequence of N tokens is cut into 2W equal chunks (W the group's size) and rank r holds
chunks r and 2W-1-r, one from the front and one from the back: under a causal mask the
front chunk sees few keys and the back chunk many, so every rank does the same work (causal
load balancing). `shard` and `unshard` move full-sequence tensors in and out of that layout,
`positions` gives the global position of each local token, and `attention` runs causal
attention (RoPE, GQA, optionally a sliding window) on the local shards of q, k and v::

    import torch.distributed as dist
    from attnfuse import distributed as cp

    group = dist.group.WORLD
    q, k, v = (cp.shard(x, group) for x in (q_full, k_full, v_full))  # [B, H, N/W, D] each
    out = cp.attention(q, k, v, group, theta=500000.0)                 # this rank's queries
    out_full = cp.unshard(out, group)                                  # [B, Hq, N, Dv]

How: every rank all-gathers K and V (one collective: torch's autograd all-gather from its
functional collectives, whose backward, a reduce-scatter, returns each rank's share of dK and
dV to its owner, summed over the ranks) and puts the gathered keys back in sequence order.
Then each of its two chunks is one ordinary causal (or sliding-window) AttnFuse call: the
chunk's queries against the keys up to the chunk's end, so the queries are the last rows of
their keys, which is the kernels' own position convention (RoPE and masks need no positions
tensor, and the causal split skips the fully masked KV blocks and runs the full ones without
mask code). The backward is those calls' derived backward plus the all-gather's backward, so
it is distributed too.

Why an all-gather rather than a ring (K/V blocks passed around the ranks, partial outputs
merged through their log-sum-exp): it is the simplest correct scheme (the one torchtitan uses
with flex_attention), it is one kernel call per rank, forward and backward, and K/V are small
next to q with GQA (Hkv < Hq), so gathering them costs little memory and bandwidth. Measured
on 2xH200 (2026-12-01, benchmarks/results/h200/run_2026-12-01_multigpu/): a Llama-3-8B layer's
fwd+bwd scales 94.4% from 1 to 2 GPUs at N = 64k (PyTorch's context_parallel + cuDNN, also
all-gather: 93.3%), with 128 MiB of K/V received per rank against 166 ms of compute. No ring
was implemented, so the two were not compared; at 2 GPUs that scaling leaves a ring little
speed to gain.
Its costs: each rank holds the full K and V (O(N) memory per rank, where a ring holds
O(N/W)), the communication is not overlapped with compute, and K's rotation runs in each of
the two calls.

Not supported, each an `AttnFuseError`: a sequence length not divisible by 2W (every rank
holds two equal chunks), queries and keys of different lengths (a KV cache), sinks (their
gradient is a sum over every rank's queries: an all-reduce) and document masks (the keys' ids
live on other ranks), both refused through `attention`'s `sink=` and `document=`, and a bad
window. Other blocks (biases, softcaps, score mods, QK-norm, other masks) have no argument
here: this module runs its own variant, it does not shard an arbitrary one.
"""

from __future__ import annotations

import functools
import numbers

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import attnfuse as af
from attnfuse.dsl.blocks import rope_scaling

__all__ = ["attention", "positions", "shard", "unshard"]

Group = dist.ProcessGroup | None
"""A process group; None is the default (world) group."""


# --------------------------------------------------------------------------- the layout


def _world(group: Group, what: str) -> tuple[int, int]:
    """(W, r): the group's size and this process's rank in it."""
    if not dist.is_available() or not dist.is_initialized():
        raise af.AttnFuseError(
            f"{what} needs an initialised torch.distributed process group (dist.init_process_group, e.g. by torchrun)"
        )
    return dist.get_world_size(group), dist.get_rank(group)


def _chunks(n: int, world: int, what: str) -> int:
    """The length of one of the 2W chunks of a sequence of n tokens."""
    if n % (2 * world):
        raise af.AttnFuseError(
            f"{what}: the sequence length must be divisible by 2 * world size = {2 * world} (each rank holds two "
            f"equal chunks, one from the front and one from the back of the sequence), got {n}"
        )
    return n // (2 * world)


def _dim(x: torch.Tensor, dim: int, what: str) -> int:
    if not -x.ndim <= dim < x.ndim:
        raise af.AttnFuseError(f"{what}: dim {dim} is out of range for a {x.ndim}-d tensor")
    return dim % x.ndim


def shard(x: torch.Tensor, group: Group = None, *, dim: int = 2) -> torch.Tensor:
    """This rank's share of a full-sequence tensor (the same on every rank): `x` cut into
    2W equal chunks along `dim` (the sequence dim, 2 for [B, H, N, D]), rank r keeping
    chunks r and 2W-1-r, concatenated in that order. Differentiable (the gradient flows to
    those chunks only)."""
    world, rank = _world(group, "attnfuse.distributed.shard")
    dim = _dim(x, dim, "attnfuse.distributed.shard")
    c = _chunks(x.shape[dim], world, "attnfuse.distributed.shard")
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world - 1 - rank) * c, c)], dim)


def _reorder(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The full sequence from every rank's shard (parts[r] = chunks r and 2W-1-r)."""
    halves = [p.chunk(2, dim) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


# torch's functional collectives with autograd (what DTensor and torchtitan use): the
# all-gather's backward is a reduce-scatter that sums every rank's gradient for a shard onto
# its owner (NCCL and gloo alike). Newer torch names it all_gather_single_autograd and
# deprecates the older name; torch.distributed.nn.functional.all_gather is deprecated too.
_all_gather_autograd = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd


def _gather(x: torch.Tensor, group: Group) -> list[torch.Tensor]:
    """Every rank's `x` (same shape everywhere), in rank order, by an autograd all-gather:
    its backward sums the gradients that every rank computed for this rank's `x` and
    returns them to it."""
    g = dist.group.WORLD if group is None else group
    assert g is not None
    stacked = _all_gather_autograd(x.contiguous(), 0, g)  # [W * x.shape[0], ...], rank order
    return list(torch.chunk(stacked, dist.get_world_size(g), dim=0))


def unshard(x_local: torch.Tensor, group: Group = None, *, dim: int = 2) -> torch.Tensor:
    """The inverse of `shard`: the full-sequence tensor, on every rank, from each rank's
    share (all-gathered, chunks put back in order). Every rank must call it with a share
    of the same shape. Differentiable: the gradient of the full tensor, summed over the
    ranks, flows back to each share's owner, so a loss on the full tensor should be computed
    on one rank or divided by W."""
    world, _ = _world(group, "attnfuse.distributed.unshard")
    dim = _dim(x_local, dim, "attnfuse.distributed.unshard")
    if x_local.shape[dim] % 2:
        raise af.AttnFuseError(
            f"attnfuse.distributed.unshard: a shard holds two equal chunks, so its length along dim {dim} must be "
            f"even, got {x_local.shape[dim]}"
        )
    return _reorder(_gather(x_local, group), dim)


def positions(n: int, group: Group = None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The global positions (int64 [n / W]) of this rank's tokens in a sequence of `n`
    tokens sharded by `shard`: chunk r's positions, then chunk 2W-1-r's."""
    world, rank = _world(group, "attnfuse.distributed.positions")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise af.AttnFuseError(f"attnfuse.distributed.positions: n must be a positive integer, got {n!r}")
    c = _chunks(int(n), world, "attnfuse.distributed.positions")
    front, back = rank * c, (2 * world - 1 - rank) * c
    return torch.cat([torch.arange(front, front + c), torch.arange(back, back + c)]).to(device)


# --------------------------------------------------------------------------- the variant


@functools.cache
def _variant(
    theta: float, scaling: object, rotary_dim: int | None, style: str, window: int | None, scale: float | None
) -> af.Variant:
    """The AttnFuse variant behind `attention`, built once per set of constants: plain causal
    (or sliding-window) attention with RoPE, called once per local chunk. A chunk's queries
    are the last rows of the keys it is given (the keys up to its own end), which is the
    kernels' own position convention: no positions tensor, and the causal split skips and
    unmasks blocks as for any causal call."""

    def cp_attention(q, k, v):
        q = af.rope(q, theta=theta, style=style, rotary_dim=rotary_dim, scaling=scaling)
        k = af.rope(k, theta=theta, style=style, rotary_dim=rotary_dim, scaling=scaling)
        s = af.qk(q, k, scale=scale)
        s = af.mask(s, af.causal if window is None else af.sliding_window(window))
        return af.pv(af.softmax(s), v)

    cp_attention.__name__ = cp_attention.__qualname__ = "context_parallel_attention"
    return af.variant(cp_attention)


def _window(window: object) -> int | None:
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or not 1 <= int(window) <= 2**31 - 1:
        raise af.AttnFuseError(
            f"attnfuse.distributed.attention window must be None or an integer in [1, 2**31 - 1] (a query sees "
            f"itself and the window - 1 positions before it), got {window!r}"
        )
    return int(window)


def _refuse(sink: object, document: object) -> None:
    if sink is not None:
        raise af.AttnFuseError(
            "attnfuse.distributed.attention does not support sinks: their gradient is a sum over every rank's "
            "queries (an all-reduce this module does not do)"
        )
    if document is not None:
        raise af.AttnFuseError(
            "attnfuse.distributed.attention does not support document masks: the document ids of the keys live "
            "on other ranks (they would have to be gathered and reordered with K and V)"
        )


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """The local sequence length shared by q, k and v."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise af.AttnFuseError(
                f"attnfuse.distributed.attention expects {name} as a 4-d tensor [B, H, N_local, D], got "
                f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
            )
    if not q.shape[2] == k.shape[2] == v.shape[2]:
        raise af.AttnFuseError(
            "attnfuse.distributed.attention is self-attention over one sharded sequence: q, k and v need the same "
            f"local length, got {q.shape[2]}, {k.shape[2]} and {v.shape[2]} (a KV cache is not supported)"
        )
    if q.shape[2] % 2:
        raise af.AttnFuseError(
            "attnfuse.distributed.attention: a shard holds two equal chunks (see shard), so the local length must "
            f"be even and the sequence length divisible by 2 * world size, got a local length of {q.shape[2]}"
        )
    return q.shape[2]


def _gather_kv(k: torch.Tensor, v: torch.Tensor, group: Group) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence's K and V, in order, from every rank's shards: one all-gather of
    k and v concatenated along the channel dim (two when their dtypes differ)."""
    if k.dtype != v.dtype:
        return _reorder(_gather(k, group), 2), _reorder(_gather(v, group), 2)
    kv = _reorder(_gather(torch.cat([k, v], dim=-1), group), 2)
    k_full, v_full = kv.split([k.shape[-1], v.shape[-1]], dim=-1)
    return k_full, v_full


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Group = None,
    *,
    theta: float = 10000.0,
    scaling: object = None,
    rotary_dim: int | None = None,
    style: str = "half",
    window: int | None = None,
    scale: float | None = None,
    sink: object = None,
    document: object = None,
) -> torch.Tensor:
    """Causal attention with RoPE over a sequence sharded across `group` by `shard`.

    q [B, Hq, N/W, D], k [B, Hkv, N/W, D] and v [B, Hkv, N/W, Dv] are this rank's shards
    (chunks r and 2W-1-r of the sequence, see `shard`); Hq a multiple of Hkv (GQA). Returns
    this rank's rows of the output, [B, Hq, N/W, Dv] in q's dtype, equal to the same rows of
    the full-sequence variant

        q = af.rope(q, theta, style, rotary_dim, scaling); k = af.rope(k, ...)
        s = af.mask(af.qk(q, k, scale), af.causal)   # or af.sliding_window(window)
        out = af.pv(af.softmax(s), v)

    `theta`, `scaling`, `rotary_dim` and `style` are af.rope's, `scale` af.qk's (default
    1/sqrt(D)); `window` None is causal attention, an integer w a sliding window of w
    positions (the query's own included). Differentiable: dq stays local, and dK and dV
    are summed over the ranks and returned to their owners by the all-gather's backward.
    Every rank of the group must call it (it is a collective) with shards of the same shape.

    `sink` and `document` exist only to refuse them with an `AttnFuseError`: sinks and
    document masks are not supported across shards (see the module's docstring)."""
    _refuse(sink, document)
    n_local = _check_shapes(q, k, v)
    world, rank = _world(group, "attnfuse.distributed.attention")
    key = (theta, rope_scaling(scaling), rotary_dim, style, _window(window), scale)
    try:
        hash(key)
    except TypeError:
        raise af.AttnFuseError(
            f"attnfuse.distributed.attention: theta, rotary_dim, style and scale must be Python numbers or strings "
            f"(af.rope's and af.qk's), got {key!r}"
        ) from None
    fn = _variant(*key)
    k_full, v_full = _gather_kv(k, v, group)
    length = n_local // 2
    outs = []
    for part, chunk in enumerate((rank, 2 * world - 1 - rank)):
        end = (chunk + 1) * length  # the chunk's queries see keys 0..end-1: they are their last rows
        q_part = q[:, :, part * length : (part + 1) * length]
        outs.append(fn(q_part, k_full[:, :, :end], v_full[:, :, :end]))
    return torch.cat(outs, dim=2)
