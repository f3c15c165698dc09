"""A variant in inference: keys as a KV cache holds them (`cache_keys`), writing new keys and
values into a cache (`append_kv`) and decoding against the cache (`decode`), contiguous or
paged. `Variant.cache_keys`, `Variant.append_kv` and `Variant.decode` are these; inside code
torch.compile traces, a decode call is one `attnfuse::decode` custom-op node
(`compiled_decode`), so `fullgraph=True` traces it without a graph break.

Decoding a sequence b whose cache holds its first `cache_seqlens[b]` positions, with queries
for its last Lq of them, gives the last Lq rows of the variant's ordinary call on the whole
sequence. K's transforms (RoPE at the keys' positions, QK-norm) are applied once, when keys are
written (`cache_keys`); Q's in the decode kernel at the queries' positions. Positions follow
the ordinary call: key j of sequence b is position j, its queries are positions
`cache_seqlens[b] - Lq ..`. Nothing in the cache past `cache_seqlens[b]` is read: unused slots
and pages may hold anything (NaN included).

On the `triton` and `interpret` backends a decode call runs the kernels kernel-path's `decode`
path generates (`passes/decode_to_tl.py`: split-KV with the query heads of each KV head packed
into one tile, and a combine kernel). On `reference` it runs the attn IR with K's chain
removed, once per sequence, on the keys the cache holds. Decoding is inference-only: a call
needing a gradient is an `AttnFuseError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from attnfuse import dsl, launch, validation
from attnfuse.dialects import attn
from attnfuse.errors import AttnFuseError
from attnfuse.ir import get_func
from attnfuse.reference import run_chain, run_reference

if TYPE_CHECKING:
    from attnfuse.runtime import Variant

MAX_DECODE_QUERIES = 16
"""The most queries per sequence a decode call takes (speculative and chunked decoding)."""
PAGE_SIZES = (16, 32, 64, 128, 256)


def analyse_trace(trace: dsl.Trace) -> Any:
    """The trace's function analysed (`passes.analysis.analyse`): its chains and score ops."""
    from attnfuse.passes.analysis import analyse

    return analyse(get_func(trace.module))


def _stand_in(like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of `shape` with `like`'s dtype and device that holds no memory (tracing and
    validation read only its attributes)."""
    return torch.empty((), dtype=like.dtype, device=like.device).expand(shape)


def _refuse_blockwise_scales(call: str, chains: Any) -> None:
    """The FP8 form's quantization takes its scales over blocks of a whole sequence's rows (or
    the whole tensor); keys written a few at a time, or the last few queries alone, would be
    scaled over other rows than the ordinary call's, so neither is defined for it yet."""
    quantized = [op for op in chains.low_precision if isinstance(op, attn.QuantizeOp)]
    if quantized:
        raise AttnFuseError(
            f"{call}: the variant quantizes with af.quantize_fp8, whose scales span blocks of a whole sequence's rows; "
            f"{call} of the FP8 form is not supported (its quantization would cover other rows than the ordinary "
            "call's)"
        )


# --------------------------------------------------------------------------- cache_keys


def cache_keys(variant: Variant, k: torch.Tensor, positions: torch.Tensor, *extras: object) -> torch.Tensor:
    """K [B, Hkv, N, D] with the variant's K transforms applied (every RoPE at `positions`, [N]
    or [B, N] integers), in k's dtype: the keys a cache holds for `decode`. `extras` are the
    variant's extra arguments after q, k, v (those K's transforms read, e.g. a QK-norm weight,
    are used). k itself when the variant does not transform K."""
    if not isinstance(k, torch.Tensor) or k.dim() != 4:
        got = list(k.shape) if isinstance(k, torch.Tensor) else type(k).__name__
        raise AttnFuseError(f"cache_keys: k must be a tensor [B, Hkv, N, D], got {got}")
    if k.dtype not in validation.QKV_DTYPES:
        raise AttnFuseError(f"cache_keys: k has dtype {k.dtype}; expected one of {list(validation.QKV_DTYPES)}")
    b, hkv, n, d = k.shape
    if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.dtype == torch.bool:
        raise AttnFuseError(f"cache_keys: positions must be an integer tensor [N] or [B, N], got {positions!r:.80}")
    if list(positions.shape) not in ([n], [b, n]):
        raise AttnFuseError(
            f"cache_keys: positions must have shape [N] = [{n}] or [B, N] = [{b}, {n}] for k of shape "
            f"{list(k.shape)}, got {list(positions.shape)}"
        )
    if positions.device != k.device:
        raise AttnFuseError(f"cache_keys: positions are on {positions.device} but k is on {k.device}")
    full = variant._bind(extras)
    validation.check_extra_values(variant.arg_names[3:], k, full)
    trace = _trace_for_keys(variant, k, full)
    chains = analyse_trace(trace)
    _refuse_blockwise_scales("cache_keys", chains)
    if not chains.k_chain:
        return k
    args = get_func(trace.module).body.block.args
    tensors = [x for x in full if isinstance(x, torch.Tensor)]
    values: dict[SSAValue, torch.Tensor] = {args[1]: k, **{a: t for a, t in zip(args[3:], tensors, strict=True)}}
    for t in tensors:
        if t.device != k.device:
            raise AttnFuseError(f"cache_keys: an extra tensor is on {t.device} but k is on {k.device}")
    dtype = torch.float64 if k.dtype == torch.float64 else torch.float32
    return run_chain(chains.k_chain, values, positions, dtype).to(k.dtype)


def _trace_for_keys(variant: Variant, k: torch.Tensor, full: tuple[object, ...]) -> dsl.Trace:
    """A trace of the variant for keys k: K's chain does not depend on q, but tracing needs a q
    head count the variant accepts (a sink or ALiBi slope per query head fixes it). Tried: the
    head counts of earlier traces, k's own, and the first dim of each extra tensor that is a
    multiple of k's heads."""
    b, hkv, _, d = k.shape
    seen = [sig[3] for sig in variant._traces if sig[4] == hkv]
    firsts = [x.shape[0] for x in full if isinstance(x, torch.Tensor) and x.dim() >= 1]
    candidates = dict.fromkeys([*seen, hkv, *(h for h in firsts if h and h % hkv == 0)])
    error: AttnFuseError | None = None
    for hq in candidates:
        try:
            return variant._trace(_stand_in(k, (b, hq, 1, d)), k, k, full)
        except AttnFuseError as e:
            error = error or e
    assert error is not None
    raise error


# --------------------------------------------------------------------------- append_kv


def append_kv(
    variant: Variant,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *extras: object,
    page_table: torch.Tensor | None = None,
    check: bool = True,
) -> torch.Tensor:
    """Write the keys and values of L new positions of every sequence into its cache, in place,
    and return the new lengths (`cache_seqlens + L`, int32): k (un-transformed) and v
    [B, Hkv, L, D] go to positions `cache_seqlens[b]` .. `cache_seqlens[b] + L - 1`, the keys
    through `cache_keys` at those positions. The cache is contiguous `[B, Hkv, S, D]`, or a paged
    pool `[pages, page_size, Hkv, D]` with `page_table` [B, max_pages] (its pages for the new
    positions assigned by the caller). With `check` (the default), that the new lengths fit the
    cache and their pages lie in the pool is checked (one device-to-host copy)."""
    k, k_cache, v_cache = _check_append_inputs(k, v, k_cache, v_cache, cache_seqlens, page_table is not None)
    b, _, n, _ = k.shape
    page = 0 if page_table is None else k_cache.shape[1]
    capacity = _check_paged(k, k_cache, page_table, "append_kv")[1] if page else k_cache.shape[2]
    lens = cache_seqlens.to(torch.int64)
    if check:
        _check_decode_values(lens, capacity, None, 0, 0, "append_kv: cache_seqlens")
        _check_decode_values(lens + n, capacity, page_table, page, k_cache.shape[0], "append_kv: cache_seqlens + L")
    positions = lens[:, None] + torch.arange(n, device=k.device)
    keys = cache_keys(variant, k, positions, *extras)
    rows = torch.arange(b, device=k.device)[:, None].expand(b, n)
    if page_table is None:
        k_cache[rows, :, positions] = keys.transpose(1, 2)
        v_cache[rows, :, positions] = v.transpose(1, 2)
    else:
        pages, slots = page_table.long()[rows, positions // page], positions % page
        k_cache[pages, slots] = keys.transpose(1, 2)
        v_cache[pages, slots] = v.transpose(1, 2)
    return (lens + n).to(torch.int32)


def _check_append_inputs(
    k: object, v: object, k_cache: object, v_cache: object, cache_seqlens: object, paged: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """append_kv's tensors: k, v [B, Hkv, L, D] and caches that hold them, lengths [B]."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise AttnFuseError(f"append_kv: {name} must be a rank-4 tensor [B, Hkv, L, D], got {got}")
    k, v = cast(torch.Tensor, k), cast(torch.Tensor, v)
    if k.shape[:3] != v.shape[:3]:
        raise AttnFuseError(
            f"append_kv: k {list(k.shape)} and v {list(v.shape)} must agree in all but the last dim ([B, Hkv, L, D])"
        )
    k, k_cache, v_cache = _check_tensors(k, k_cache, v_cache, "append_kv", "k")
    b, hkv, _, d = k.shape
    heads = k_cache.shape[2 if paged else 1]
    fits = (
        heads == hkv and k_cache.shape[3] == d and v_cache.shape[3] == v.shape[3] and (paged or k_cache.shape[0] == b)
    )
    if not fits or k_cache.shape[:3] != v_cache.shape[:3]:
        where = "[pages, page_size, Hkv, D]" if paged else "[B, Hkv, S, D]"
        raise AttnFuseError(
            f"append_kv: caches {list(k_cache.shape)} and {list(v_cache.shape)} ({where}) do not hold k "
            f"{list(k.shape)} and v {list(v.shape)} ([B, Hkv, L, D])"
        )
    _check_lengths("append_kv", cache_seqlens, b, k.device)
    return k, k_cache, v_cache


# --------------------------------------------------------------------------- decode


def _check_tensors(
    q: object, k_cache: object, v_cache: object, call: str = "decode", first: str = "q"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (or the tensor named `first`) and the caches: rank-4 tensors of one supported dtype on
    one device."""
    for name, t in ((first, q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            layout = "[B, Hq, Lq, D]" if name == "q" else "[B, Hkv, S, D] (or a paged pool [pages, page_size, Hkv, D])"
            raise AttnFuseError(f"{call}: {name} must be a rank-4 tensor {layout}, got {got}")
    q, k_cache, v_cache = cast(torch.Tensor, q), cast(torch.Tensor, k_cache), cast(torch.Tensor, v_cache)
    if q.dtype not in validation.QKV_DTYPES:
        raise AttnFuseError(f"{call}: {first} has dtype {q.dtype}; expected one of {list(validation.QKV_DTYPES)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise AttnFuseError(
                f"{call}: {name} has dtype {t.dtype} but {first} has {q.dtype}: they must share a dtype"
            )
        if t.device != q.device:
            raise AttnFuseError(f"{call}: {name} is on {t.device} but {first} is on {q.device}")
    return q, k_cache, v_cache


def _check_decode_inputs(
    q: object, k_cache: object, v_cache: object, cache_seqlens: object, page_table: object
) -> tuple[int, int]:
    """Check a decode call's tensors; returns (page size or 0, the cache's capacity in keys)."""
    q, k_cache, v_cache = _check_tensors(q, k_cache, v_cache)
    batch, hq, lq, d = q.shape
    if not 1 <= lq <= MAX_DECODE_QUERIES:
        raise AttnFuseError(
            f"decode: q holds {lq} queries per sequence (dim 2 of [B, Hq, Lq, D]); decode takes 1 to "
            f"{MAX_DECODE_QUERIES} (call the variant itself for a longer prefill)"
        )
    paged = page_table is not None
    head_dim, kv_dim = (2, 1) if paged else (1, 2)
    where = "[pages, page_size, Hkv, D]" if paged else "[B, Hkv, S, D]"
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise AttnFuseError(
            f"decode: k_cache {list(k_cache.shape)} and v_cache {list(v_cache.shape)} must agree in all but the "
            f"last dim ({where})"
        )
    hkv = k_cache.shape[head_dim]
    if k_cache.shape[3] != d:
        raise AttnFuseError(f"decode: k_cache has head dim {k_cache.shape[3]} but q has {d} ({where})")
    if hkv == 0 or hq % hkv:
        raise AttnFuseError(
            f"decode: q has {hq} heads, not a multiple of the cache's {hkv} KV heads (dim {head_dim} of {where})"
        )
    _check_lengths("decode", cache_seqlens, batch, q.device)
    if not paged:
        if k_cache.shape[0] != batch:
            raise AttnFuseError(f"decode: k_cache has batch size {k_cache.shape[0]} but q has {batch} ({where})")
        return 0, k_cache.shape[kv_dim]
    return _check_paged(q, k_cache, page_table)


def _check_lengths(call: str, cache_seqlens: object, batch: int, device: torch.device) -> None:
    """cache_seqlens: an int32 (or int64) tensor [B] on the call's device."""
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise AttnFuseError(f"{call}: cache_seqlens must be an int32 tensor [B], got {cache_seqlens!r:.80}")
    if list(cache_seqlens.shape) != [batch] or cache_seqlens.device != device:
        raise AttnFuseError(
            f"{call}: cache_seqlens must have shape [B] = [{batch}] on {device}, got {list(cache_seqlens.shape)} "
            f"on {cache_seqlens.device}"
        )


def _check_paged(q: torch.Tensor, pool: torch.Tensor, page_table: object, call: str = "decode") -> tuple[int, int]:
    """A paged cache's page size and page table; returns (page size, capacity in keys)."""
    page, batch = pool.shape[1], q.shape[0]
    if page not in PAGE_SIZES:
        raise AttnFuseError(
            f"{call}: the paged cache's page size (dim 1 of [pages, page_size, Hkv, D]) must be one of {PAGE_SIZES}, "
            f"got {page}"
        )
    pt = page_table
    if not isinstance(pt, torch.Tensor) or pt.dtype != torch.int32 or pt.dim() != 2 or pt.shape[0] != batch:
        got = f"{pt.dtype} {list(pt.shape)}" if isinstance(pt, torch.Tensor) else type(pt).__name__
        raise AttnFuseError(f"{call}: page_table must be an int32 tensor [B, max_pages] with B = {batch}, got {got}")
    if pt.device != q.device:
        raise AttnFuseError(f"{call}: page_table is on {pt.device} but the queries and caches are on {q.device}")
    return page, pt.shape[1] * page


def _check_decode_values(
    cache_seqlens: torch.Tensor,
    capacity: int,
    page_table: torch.Tensor | None,
    page: int,
    pages: int,
    call: str = "decode: cache_seqlens",
) -> None:
    """Lengths within the cache, page-table entries the lengths use within the pool: one
    device-to-host copy. `call` names the lengths in the error."""
    lens = cache_seqlens.to(torch.int64)
    flags = [(lens < 0).any(), (lens > capacity).any()]
    if page_table is not None:
        used = torch.arange(page_table.shape[1], device=lens.device)[None, :] * page < lens[:, None]
        flags.append((used & ((page_table < 0) | (page_table >= pages))).any())
    bad = torch.stack(flags).tolist()
    if bad[0] or bad[1]:
        raise AttnFuseError(f"{call} must lie in [0, {capacity}] (the cache's capacity), got {lens.tolist()[:16]}")
    if page_table is not None and bad[2]:
        raise AttnFuseError(
            f"{call.split(':')[0]}: page_table points outside the pool of {pages} pages for positions below "
            f"{call.split(': ')[-1]}"
        )


DecodeRun = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[object, ...], "torch.Tensor | None"], torch.Tensor
]
"""How one decode signature runs: (q, k_cache, v_cache, cache_seqlens int32, extras, page_table) -> out."""


def decode(
    variant: Variant,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *extras: object,
    page_table: torch.Tensor | None = None,
    check: bool = True,
) -> torch.Tensor:
    """The variant's output [B, Hq, Lq, Dv] for queries q [B, Hq, Lq, D] (un-transformed) at the
    last Lq positions of sequences whose first `cache_seqlens[b]` positions the cache holds (see
    the module docstring). With `check` (the default) the lengths and the page table's entries
    are checked against the cache, which costs one device-to-host copy; `check=False` skips it
    (and is what CUDA-graph capture needs).

    A signature seen before (backend, device, dtype, query and KV heads, head dims, page size,
    capacity, the extras' dtypes, shapes and devices) skips tracing and kernel lookup: its run is
    kept on the variant. Under torch.compile the call is one `attnfuse::decode` node, without the
    value checks (`compiled_decode`)."""
    if torch.compiler.is_compiling():
        return compiled_decode(variant, q, k_cache, v_cache, cache_seqlens, extras, page_table)
    page, capacity = _check_decode_inputs(q, k_cache, v_cache, cache_seqlens, page_table)
    if check and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        _check_decode_values(cache_seqlens, capacity, page_table, page, k_cache.shape[0])
    # The kernels index the lengths from their first element: another dtype or a strided view (an
    # expanded scalar length, say) is copied.
    cache_seqlens = cache_seqlens.to(torch.int32).contiguous()
    inputs = (q, k_cache, v_cache, *extras)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
        raise AttnFuseError(
            f"{variant.__name__}.decode is inference-only and builds no backward, but an input requires grad; "
            "run it under torch.no_grad(), or call the variant itself for a differentiable output"
        )
    backend_name = launch.current_backend()
    hkv = k_cache.shape[2 if page else 1]
    key: tuple[Any, ...] = (backend_name, q.device, q.dtype, q.shape[1], hkv, q.shape[3], v_cache.shape[3], page)
    key += (capacity, *((x.dtype, x.shape, x.device) if isinstance(x, torch.Tensor) else (type(x), x) for x in extras))
    try:
        run = variant._decode_hot[key]
    except (KeyError, TypeError):
        run = _prepare_decode(variant, backend_name, q, k_cache, v_cache, extras, page, capacity)
        try:
            variant._decode_hot[key] = run
        except TypeError:  # an unhashable constant: no hot path for this signature
            pass
    if q.shape[0] == 0:
        return q.new_zeros((0, q.shape[1], q.shape[2], v_cache.shape[3]))
    return run(q, k_cache, v_cache, cache_seqlens, extras, page_table)


def _prepare_decode(
    variant: Variant,
    backend_name: str,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    extras: tuple[object, ...],
    page: int,
    capacity: int,
) -> DecodeRun:
    """Trace and validate a new decode signature and find its kernels: how it runs."""
    batch, _, _, d = q.shape
    hkv = k_cache.shape[2 if page else 1]
    k_l = _stand_in(k_cache, (batch, hkv, capacity, d))
    v_l = _stand_in(v_cache, (batch, hkv, capacity, v_cache.shape[3]))
    trace, full = variant._validated_trace(q, k_l, v_l, extras)
    validation.check_against_trace(trace, q, k_l, v_l, extras)
    _refuse_blockwise_scales("decode", analyse_trace(trace))
    n_given = len(extras)
    tail = full[n_given:]

    def tensors_of(given: tuple) -> list[torch.Tensor]:
        return [x for x in (*given, *tail) if isinstance(x, torch.Tensor)]

    mode = launch.kernel_mode(launch.check_backend(backend_name, "af.backend"), q)
    if mode == "reference":
        return lambda q, k, v, lens, ex, table: _reference_decode(trace, q, k, v, lens, tensors_of(ex), table, page)
    if q.dtype == torch.float64:
        raise AttnFuseError(
            f"decode: q, k_cache and v_cache are float64, which the {mode} backend does not run; "
            "af.backend('reference') computes float64 calls in float64"
        )
    interpret = mode == "interpret"
    if interpret and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong: float32 kernels

        def via_float32(q, k, v, lens, ex, table):  # type: ignore[no-untyped-def]
            f32 = [cast(torch.Tensor, launch.as_float32(t)) for t in (q, k, v)]
            ex32 = tuple(launch.as_float32(x) for x in ex)
            return decode(variant, *f32, lens, *ex32, page_table=table, check=False).to(torch.bfloat16)

        return via_float32
    _, run, _ = launch.load_kernel(trace, q, k_l, v_l, interpret, direction="decode", page_size=page)
    # The run outlives this call, so it keeps no device tensor: a stand-in allocated while a
    # CUDA-graph warm-up routes allocations into the graph's pool may not outlive the capture.
    capacity_like = k_l if interpret else None
    del k_l, v_l

    def kernels(q, k, v, lens, ex, table):  # type: ignore[no-untyped-def]
        if capacity_like is not None:
            launch.warn_if_slow(q, capacity_like)  # the cache's capacity, paged or not
        paged = () if table is None else (table,)
        return run(q, k, v, *tensors_of(ex), lens, *paged, lse=launch.lse_workspace(q))[0]

    return kernels


_DECODE_MODULES: dict[str, ModuleOp] = {}


def decode_module(trace: dsl.Trace) -> ModuleOp:
    """The trace's IR with K's chain removed: attn.qk reads the k argument as the cache holds it."""
    module = _DECODE_MODULES.get(trace.text)
    if module is None:
        module = trace.module.clone()
        from attnfuse.passes.analysis import analyse

        chains = analyse(get_func(module))
        if chains.k_chain:
            chains.k_chain[-1].results[0].replace_all_uses_with(chains.k_arg)
            for op in reversed(chains.k_chain):
                op.detach()
                op.erase()
        _DECODE_MODULES[trace.text] = module
    return module


def gather_cache(cache: torch.Tensor, b: int, n: int, page_table: torch.Tensor | None) -> torch.Tensor:
    """Sequence b's first n positions of a cache, [Hkv, n, D] (contiguous or paged)."""
    if page_table is None:
        return cache[b, :, :n]
    page = cache.shape[1]
    pages = page_table[b, : -(-n // page)].to(torch.int64)
    rows = cache[pages].reshape(-1, cache.shape[2], cache.shape[3])[:n]
    return rows.permute(1, 0, 2)


def _reference_decode(
    trace: dsl.Trace,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    tensors: list[torch.Tensor],
    page_table: torch.Tensor | None,
    page: int,
) -> torch.Tensor:
    """Each sequence through the reference executor: the IR without K's chain, on a batch whose
    entries all hold sequence b's cached keys and values (entry b's output is kept, so batch-indexed
    extras read row b), extras of the key length cut to it."""
    module = decode_module(trace)
    cut = [
        [(dim, spec) for dim, rel, size, _ in spec.dim_reqs if size == "Nk" and rel == "eq"]
        for spec in trace.extras
        if spec is not None
    ]
    dtype = launch.reference_dtype(q)
    batch, hkv = q.shape[0], k_cache.shape[2 if page else 1]
    out = q.new_zeros((batch, q.shape[1], q.shape[2], v_cache.shape[3]))
    for b, n in enumerate(cache_seqlens.tolist()):
        # Every batch entry sees sequence b's keys (a broadcast view): entry b's output is kept.
        k_b = gather_cache(k_cache, b, n, page_table)[None].expand(batch, hkv, n, k_cache.shape[3])
        v_b = gather_cache(v_cache, b, n, page_table)[None].expand(batch, hkv, n, v_cache.shape[3])
        extras_b = [t.narrow(dims[0][0], 0, n) if dims else t for t, dims in zip(tensors, cut, strict=False)]
        out[b] = run_reference(module, q, k_b, v_b, *extras_b, compute_dtype=dtype)[b].to(q.dtype)
    return out


# --------------------------------------------------------------------------- under torch.compile

_DECODE_SITES: dict[str, tuple[Any, str, tuple[tuple[bool, object], ...]]] = {}


@torch._dynamo.assume_constant_result
def _decode_key(handle: str, consts: tuple[tuple[bool, object], ...]) -> str:
    """The key of a decode call site (run when torch.compile traces it: a constant of the graph),
    reading the backend in effect then."""
    from attnfuse.autograd import variant_of

    backend = launch.current_backend()
    key = f"decode:{handle}:{backend}:{consts!r}"
    if key not in _DECODE_SITES:
        _DECODE_SITES[key] = (variant_of(handle), backend, consts)
    return key


def compiled_decode(
    variant: Variant,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    extras: tuple[object, ...],
    page_table: torch.Tensor | None,
) -> torch.Tensor:
    """A decode call inside code torch.compile traces: one `attnfuse::decode` node (no graph break;
    no value checks, which would synchronise)."""
    from attnfuse.autograd import _specialized

    consts = tuple((True, None) if isinstance(x, torch.Tensor) else (False, _specialized(x)) for x in extras)
    tensors = [x for x in extras if isinstance(x, torch.Tensor)]
    key = _decode_key(variant._handle, consts)
    return torch.ops.attnfuse.decode(key, q, k_cache, v_cache, cache_seqlens, page_table, tensors)


@torch.library.custom_op("attnfuse::decode", mutates_args=())
def decode_op(
    key: str,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    extras: list[torch.Tensor],
) -> torch.Tensor:
    """`Variant.decode` of the call site `key` names (`compiled_decode`)."""
    variant, backend, consts = _DECODE_SITES[key]
    given = iter(extras)
    full = tuple(next(given) if is_tensor else value for is_tensor, value in consts)
    with launch.backend(backend):
        return decode(variant, q, k_cache, v_cache, cache_seqlens, *full, page_table=page_table, check=False)


@decode_op.register_fake
def _decode_fake(key, q, k_cache, v_cache, cache_seqlens, page_table, extras):  # type: ignore[no-untyped-def]
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3]))
