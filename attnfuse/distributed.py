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

Every call checks first that the ranks agree (shapes, dtypes, variant arguments and IR, which
K/V tensors record gradients), with one all-gather of a few int64 per rank: a rank with
another RoPE theta would silently compute another attention, and other mismatches fail inside
gloo or NCCL or hang; see `attention`.

Not supported, each an `AttnFuseError`: a sequence length not divisible by 2W (every rank
holds two equal chunks), queries and keys of different lengths (a KV cache), sinks (their
gradient is a sum over every rank's queries: an all-reduce) and document masks (the keys' ids
live on other ranks), both refused through `attention`'s `sink=` and `document=`, and a bad
window. Other blocks (biases, softcaps, score mods, QK-norm, other masks) have no argument
here: this module runs its own variant, it does not shard an arbitrary one.
"""

from __future__ import annotations

import functools
import hashlib
import math
import numbers
import struct
from collections.abc import Callable, Sequence

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


def _key(theta: object, scaling: object, rotary_dim: object, style: object, window: object, scale: object) -> tuple:
    """The constants of `_variant` (af.rope and af.qk check them when it is traced)."""
    key = (theta, rope_scaling(scaling), rotary_dim, style, _window(window), scale)
    try:
        hash(key)
    except TypeError:
        raise af.AttnFuseError(
            f"attnfuse.distributed.attention: theta, rotary_dim, style and scale must be Python numbers or strings "
            f"(af.rope's and af.qk's), got {key!r}"
        ) from None
    return key


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


# --------------------------------------------------------------------------- agreement across the ranks
#
# Every rank must call `attention` with shards of the same shape and dtype and with the same
# variant: a rank with another theta silently computes another attention, shards of different
# lengths, batches or dtypes fail inside gloo or NCCL (or hang), a rank that refuses its own
# arguments leaves the others waiting in the all-gather, and a rank that records K/V gradients
# while another does not waits in the backward's reduce-scatter until the group's timeout. So
# each call first all-gathers `_FIELDS` (a few int64 per rank, one small collective) and every
# rank raises the same refusal, before any other communication, when the ranks disagree.

Decode = Callable[[int], "str | None"]
"""How a field's int64 reads in a message (None: not readable, a digest)."""


def _digest(text: str) -> int:
    """A 63-bit digest of `text`, the same in every process (unlike hash() of a str)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def _float_bits(x: object) -> int:
    """The float64 bits of x as an int64 (None as NaN)."""
    return struct.unpack("<q", struct.pack("<d", math.nan if x is None else float(x)))[0]  # type: ignore[arg-type]


def _from_bits(bits: int) -> str:
    x = struct.unpack("<d", struct.pack("<q", bits))[0]
    return "None" if math.isnan(x) else repr(x)


def _optional_int(x: int) -> str:
    return "None" if x < 0 else str(x)


def _unreadable(_: int) -> None:
    return None


_DTYPE_NAMES = {_digest(str(d)): str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
_STYLE_NAMES = {_digest(repr(s)): repr(s) for s in ("half", "interleaved")}
_GRAD_NAMES = {0: "neither", 1: "k only", 2: "v only", 3: "k and v"}
_VARIANT_IR = "the traced variant (its attn IR: the same arguments but different AttnFuse versions?)"
_FIELDS: tuple[tuple[str, Decode], ...] = (
    ("batch", str),
    ("query heads", str),
    ("key/value heads", str),
    ("local length", str),
    ("head dim", str),
    ("value head dim", str),
    ("q's dtype", _DTYPE_NAMES.get),
    ("k's dtype", _DTYPE_NAMES.get),
    ("v's dtype", _DTYPE_NAMES.get),
    ("K/V gradients recorded (k or v requiring grad under grad mode; the backward is a collective)", _GRAD_NAMES.get),
    ("theta", _from_bits),
    ("scaling", _unreadable),
    ("rotary_dim", _optional_int),
    ("style", _STYLE_NAMES.get),
    ("window", _optional_int),
    ("scale", _from_bits),
    (_VARIANT_IR, _unreadable),
)
"""What the ranks must agree on, in the order of `_fields`, with how each reads."""


@functools.cache
def _ir_digest(key: tuple, dtypes: tuple[torch.dtype, ...], heads: tuple[int, int], dims: tuple[int, int]) -> int:
    """The digest of the variant's canonical attn IR for these dtypes, heads and head dims
    (traced once per signature, on meta tensors; the call itself reuses the trace)."""
    (hq, hkv), (d, dv) = heads, dims
    shapes = ((1, hq, 2, d), (1, hkv, 2, d), (1, hkv, 2, dv))
    q, k, v = (torch.empty(s, dtype=t, device="meta") for s, t in zip(shapes, dtypes, strict=True))
    return _digest(_variant(*key).ir(q, k, v))


def _fields(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key: tuple) -> list[int]:
    """This rank's values of `_FIELDS` for a validated call with variant constants `key`."""
    theta, scaling, rotary_dim, style, window, scale = key
    grads = int(k.requires_grad) + 2 * int(v.requires_grad) if torch.is_grad_enabled() else 0
    dtypes = (q.dtype, k.dtype, v.dtype)
    ir = _ir_digest(key, dtypes, (q.shape[1], k.shape[1]), (q.shape[3], v.shape[3]))
    return [
        *(q.shape[0], q.shape[1], k.shape[1], q.shape[2], q.shape[3], v.shape[3]),
        *(_digest(str(t)) for t in dtypes),
        grads,
        _float_bits(theta),
        _digest(str(scaling)),
        -1 if rotary_dim is None else int(rotary_dim),
        _digest(repr(style)),
        -1 if window is None else window,
        _float_bits(scale),
        ir,
    ]


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _disagreement(name: str, decode: Decode, column: Sequence[int]) -> str:
    """What the ranks have for one field on which they disagree."""
    names = [decode(x) for x in column]
    if all(n is not None for n in names):
        return f"{name}: " + ", ".join(f"rank {r} has {n}" for r, n in enumerate(names))
    groups: dict[int, list[int]] = {}
    for r, x in enumerate(column):
        groups.setdefault(x, []).append(r)
    return f"{name} differs between " + " and ".join(_ranks(rs) for rs in groups.values())


def _check_device(q: object, group: Group) -> torch.device:
    """Where the agreement check's tensor lives: q's device (the all-gather of K and V uses
    it too), or, when q is not a tensor, the device the group's backend takes."""
    if isinstance(q, torch.Tensor):
        return q.device
    nccl = "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available()
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def _agree(values: list[int] | None, error: Exception | None, group: Group, device: torch.device) -> None:
    """All-gather every rank's `_FIELDS` (`values`; None with the `error` that refused this
    rank's arguments) and raise, on every rank, when a rank refused its arguments or the
    ranks disagree. One all_gather of len(_FIELDS) + 1 = 18 int64 per rank, and on a GPU a
    synchronisation (the host reads the result)."""
    mine = torch.tensor([int(error is not None), *(values or [0] * len(_FIELDS))], dtype=torch.int64, device=device)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    table = torch.stack(parts).tolist()
    if error is not None:
        raise error
    refused = [r for r, row in enumerate(table) if row[0]]
    if refused:
        raise af.AttnFuseError(
            f"attnfuse.distributed.attention: {_ranks(refused)} of the group refused its arguments (see the "
            f"error raised there), so every rank stops here: it is a collective"
        )
    columns = list(zip(*(row[1:] for row in table), strict=True))
    differ = [i for i, column in enumerate(columns) if len(set(column)) > 1]
    if len(differ) > 1 and _FIELDS[differ[-1]][0] == _VARIANT_IR:
        differ.pop()  # a consequence of the others
    if differ:
        raise af.AttnFuseError(
            "attnfuse.distributed.attention: the ranks of the group were called with different arguments (this is "
            f"rank {dist.get_rank(group)}): "
            + "; ".join(_disagreement(*_FIELDS[i], columns[i]) for i in differ)
            + ". Every rank must call it with shards of the same shape and dtype, the same variant arguments "
            "(theta, scaling, rotary_dim, style, window, scale) and the same K/V tensors requiring grad"
        )


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
    Every rank of the group must call it (it is a collective) with shards of the same shape
    and dtype, the same variant arguments and the same K/V tensors requiring grad (under grad
    mode): each call first all-gathers a few int64 per rank saying so (one small collective; on
    a GPU its result is read on the host, a synchronisation) and raises an `AttnFuseError` on
    every rank, naming the ranks and what differs, when they disagree or when one rank refused
    its own arguments. The variant itself is compared through a digest of its traced IR,
    computed once per variant and signature. What no check can see is a rank that records
    gradients and then never calls backward (or drops the output): the backward's reduce-scatter
    is a collective too, and, as for any collective, every rank that ran the forward with
    gradients must run its backward, or the others wait until the group's timeout.

    `sink` and `document` exist only to refuse them with an `AttnFuseError`: sinks and
    document masks are not supported across shards (see the module's docstring)."""
    world, rank = _world(group, "attnfuse.distributed.attention")
    try:
        _refuse(sink, document)
        _check_shapes(q, k, v)
        key = _key(theta, scaling, rotary_dim, style, window, scale)
        values, error = _fields(q, k, v, key), None
    except Exception as e:  # raised by _agree after every rank learnt of it, never on this rank alone (a hang)
        key, values, error = None, None, e
    if world > 1:
        _agree(values, error, group, _check_device(q, group))
    elif error is not None:
        raise error
    assert key is not None
    fn = _variant(*key)
    k_full, v_full = _gather_kv(k, v, group)
    length = q.shape[2] // 2
    outs = []
    for part, chunk in enumerate((rank, 2 * world - 1 - rank)):
        end = (chunk + 1) * length  # the chunk's queries see keys 0..end-1: they are their last rows
        q_part = q[:, :, part * length : (part + 1) * length]
        outs.append(fn(q_part, k_full[:, :, :end], v_full[:, :, :end]))
    return torch.cat(outs, dim=2)
