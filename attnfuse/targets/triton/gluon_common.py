# type: ignore
"""What the sm90 Gluon kernels share: the tile order, the TMA ring with its mbarriers, the
ping-pong between consumer partitions and Q's and K's transforms in shared memory.
`gluon_sm90.py` (the forward) and `gluon_bwd_sm90.py` (the backward) are built from them; other
sm90 kernels take them from here rather than copying them.

Generated modules that launch a Gluon kernel carry this file's code before the kernel's
(`printer.gluon_source`), from its first `triton.experimental` import on, so it imports
only Triton (and torch, which generated modules import before it) and defines only `@gluon.jit`
functions (names `_gl_*`) and three host functions: two that describe a tensor to them as a TMA
descriptor (`_gl_view`, `_gl_desc`) and the key of what Triton specialised a binary on
(`_gl_spec`).

- Tile order (`_gl_tile_order`, `_gl_block_classes`): one program per (batch*head, tile) on a
  (B*H, tiles) grid, the heaviest tiles (the last, under a causal mask) launched first; the
  blocks a tile visits, split into a first block, masked, unmasked and masked blocks, from the
  bounds a range hook gives.
- The TMA ring: STAGES shared-memory slots per operand (`_gl_ring_alloc`), each guarded by a
  ready mbarrier per operand and one empty mbarrier (`_gl_barriers`, `_gl_ring_init`; the forward
  gives each operand its own empty barriers, to release K a step before V). The producer waits until
  a slot is free (`_gl_ring_wait_free`; the first STAGES waits pass at once) and loads block i
  into slot i % STAGES (`_gl_ring_load`); a consumer waits for it (`_gl_ring_wait`) and releases
  it when done (`_gl_ring_release`). Phases: the (i // STAGES)-th use of a slot waits for phase
  (i // STAGES) & 1.
- Ping-pong (`_gl_take_turn`, `_gl_pass_turn`; `_gl_turn_start` / `_gl_turn_end` call them only
  when a kernel's PINGPONG is set): the consumer warpgroups take turns, in order, issuing their
  asynchronous wgmmas through one turn mbarrier each (`_gl_barriers(consumers)`,
  `_gl_turns_init`), so one's pointwise work (the forward's softmax, the dQ kernel's P and dS)
  runs while another's products occupy the tensor cores.
- Where a row is (`_gl_at`): a [B, H, N, D] tensor's descriptor views it as [B * H * N, D] rows
  when contiguous, or as [B * N, H * D] when its heads are inner to its sequence (transformers'
  layout, read and written in place); row n of head bh is at (bh * N + n, 0) or
  ((bh // H) * N + n, (bh % H) * D).
- Q's and K's transforms in shared memory (`_gl_rope_tables`, `_gl_rows_prologue`): RoPE (half
  style, every channel; its cos and sin from the launcher's tables, `_gl_rope_at`) and RMSNorm on
  a consumer's rows of a tile once it arrives, as the forward rotates its Q tile and the backward
  its keys.
- TMA reduce-add (`_gl_tma_reduce_add`): a shared-memory tile added into global memory by the
  TMA unit (`cp.reduce.async.bulk.tensor ... add`), as FlashAttention-3 accumulates dQ. Triton
  3.6's Gluon builds the op (`create_async_tma_reduce`) but exports no function for it, so
  this is that function; `tma.store_wait` waits for it as for a TMA store.
"""

# Gluon kernels are a DSL that Triton traces (constexpr arguments, layouts as values), not
# Python that a static type checker can follow; pyright skips this file.

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin as _gl_builtin
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# fmt: off


@gluon.jit
def _gl_tile_order():
    """This program's batch*head and tile, heaviest tile first: the grid's second axis walked
    from its last tile (under a causal mask the last Q tiles do the most work, and starting
    them first shortens the launch's tail)."""
    off_hz = gl.program_id(0)
    tile = gl.num_programs(1) - 1 - gl.program_id(1)
    return off_hz, tile


@gluon.jit
def _gl_block_classes(lo, f_lo, f_hi, hi, BLOCK_N: gl.constexpr):
    """The blocks of BLOCK_N rows a tile visits, from a range hook's bounds: rows [lo, hi) hold
    some kept score, rows [f_lo, f_hi) only kept ones. Returns (j0, a, b, j_end): blocks
    [j0, j_end) are visited; block j0 and blocks [j0 + 1, a) and [b, j_end) are masked, blocks
    [a, b) need no mask."""
    j0 = lo // BLOCK_N
    a = gl.maximum((f_lo + BLOCK_N - 1) // BLOCK_N, j0 + 1)
    b = gl.maximum(f_hi // BLOCK_N, a)
    j_end = (hi + BLOCK_N - 1) // BLOCK_N
    return j0, a, b, j_end


@gluon.jit
def _gl_pack16(p, dtype: gl.constexpr):
    """p rounded to the 16-bit dtype two elements at a time (cvt.rn.f16x2 / bf16x2)."""
    if dtype == gl.float16:
        r = gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [p], dtype=gl.float16,
                                      is_pure=True, pack=2)
    else:
        gl.static_assert(dtype == gl.bfloat16, "_gl_pack16 rounds to float16 or bfloat16")
        r = gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [p], dtype=gl.bfloat16,
                                      is_pure=True, pack=2)
    return r


@gluon.jit
def _gl_ring_alloc(desc, STAGES: gl.constexpr):
    """STAGES shared-memory slots, each one block of the TMA descriptor `desc`."""
    return gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout)


@gluon.jit
def _gl_barriers(COUNT: gl.constexpr):
    """COUNT mbarriers in shared memory (`_gl_ring_init`, `_gl_turns_init` initialise them).
    A kernel allocates all its buffers and barriers before it initialises any."""
    return gl.allocate_shared_memory(gl.int64, [COUNT, 1], mbarrier.MBarrierLayout())


@gluon.jit
def _gl_ring_init(ready_a, ready_b, empty_bars, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, empty_b=None):
    """Initialise a ring of STAGES slots streaming two operands (K and V; Q and dO): per slot a
    ready barrier for each (one arrival: the TMA load's) and an empty barrier that completes
    once all CONSUMERS released the slot; with `empty_b`, the second operand's own empty
    barriers too (its slots then released apart from the first's)."""
    for i in gl.static_range(STAGES):
        mbarrier.init(ready_a.index(i), count=1)
        mbarrier.init(ready_b.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=CONSUMERS)
    if empty_b is not None:
        for i in gl.static_range(STAGES):
            mbarrier.init(empty_b.index(i), count=CONSUMERS)


@gluon.jit
def _gl_ring_wait_free(empty_bars, i, STAGES: gl.constexpr):
    """Producer: wait until the slot of ring position i is free (every consumer released the
    block that used it before; the first STAGES waits pass at once)."""
    mbarrier.wait(empty_bars.index(i % STAGES), ((i // STAGES) & 1) ^ 1)


@gluon.jit
def _gl_ring_load(desc, row, ready_bars, smem, i, STAGES: gl.constexpr, col=0):
    """Producer: TMA-load the block of `desc` at (`row`, `col`) into the slot of ring position
    i; its ready barrier completes when the bytes have landed."""
    slot = i % STAGES
    mbarrier.expect(ready_bars.index(slot), desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [row, col], ready_bars.index(slot), smem.index(slot))


@gluon.jit
def _gl_at(INNER: gl.constexpr, bh, heads, N, n, HEAD_D: gl.constexpr):
    """(row, column) of row n of head bh (= batch * heads + head) of a [B, heads, N, D] tensor in
    its descriptor's 2-D view: [B * heads * N, D] rows when contiguous, or, for a tensor whose
    heads are inner to its sequence (INNER: a [B, N, heads, D] tensor seen through
    transpose(1, 2), as transformers hands q, k and v over), [B * N, heads * D]."""
    row = bh * N + n
    col = 0
    if INNER:
        row = (bh // heads) * N + n
        col = (bh % heads) * HEAD_D
    return row, col


@gluon.jit
def _gl_ring_wait(ready_bars, i, STAGES: gl.constexpr):
    """Consumer: wait until the block of ring position i has landed in its slot."""
    mbarrier.wait(ready_bars.index(i % STAGES), (i // STAGES) & 1)


@gluon.jit
def _gl_ring_release(empty_bars, i, STAGES: gl.constexpr):
    """Consumer: done with the slot of ring position i (the producer may refill it once every
    consumer has released it)."""
    mbarrier.arrive(empty_bars.index(i % STAGES), count=1)


@gluon.jit
def _gl_turns_init(turn_bars):
    """Initialise the ping-pong turn barriers, one per consumer (`_gl_barriers(consumers)`)."""
    COUNT: gl.constexpr = turn_bars.shape[0]
    for i in gl.static_range(COUNT):
        mbarrier.init(turn_bars.index(i), count=1)


@gluon.jit
def _gl_take_turn(turn_bars, event, WG: gl.constexpr):
    """Ping-pong: consumer WG's wgmma issue number `event` waits until the consumer before it
    (WG - 1, cyclically) has issued its own; consumer 0's first issue does not wait."""
    FIRST: gl.constexpr = 1 if WG == 0 else 0
    mbarrier.wait(turn_bars.index(WG), (event & 1) ^ FIRST)


@gluon.jit
def _gl_pass_turn(turn_bars, WG: gl.constexpr):
    """Ping-pong: the next consumer (WG + 1, cyclically) may issue its wgmmas now."""
    COUNT: gl.constexpr = turn_bars.shape[0]
    mbarrier.arrive(turn_bars.index((WG + 1) % COUNT), count=1)


@gluon.jit
def _gl_turn_start(turn_bars, event, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Before a consumer's wgmma issue number `event`: its turn, with ping-pong."""
    if PINGPONG:
        _gl_take_turn(turn_bars, event, WG)


@gluon.jit
def _gl_turn_end(turn_bars, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """After a consumer's wgmma issue: the next consumer's turn, with ping-pong."""
    if PINGPONG:
        _gl_pass_turn(turn_bars, WG)


@_gl_builtin
def _gl_tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile `src` into the block of `tensor_desc` at `coord`, by TMA
    (asynchronous: `tma.store_wait` waits until `src` may be overwritten)."""
    from triton._C.libtriton import ir  # here: generated modules carry this file from its gluon imports on

    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


def _gl_view(x, inner, rows, layout):
    """x's descriptor spec (tensor, 2-D view width, box rows, box columns, layout): rows of D
    channels of [B * H * N, D], or of [B * N, H * D] when its heads are `inner`."""
    d = x.shape[3]
    if inner:
        return x.transpose(1, 2), x.shape[1] * d, rows, d, layout
    return x, d, rows, d, layout


def _gl_desc(t, width, rows, cols, layout):
    """A TMA descriptor of t's [-1, width] view in boxes of [rows, cols]."""
    flat = t.view(-1, width)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, cols], layout)


def _gl_spec(x):
    """What Triton specialises a kernel argument on: a tensor's dtype and 16-byte alignment,
    an integer's being 1, a multiple of 16 or beyond int32 (a direct-binary launch must match
    them)."""
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    if isinstance(x, bool) or not isinstance(x, int):
        return type(x)
    return x == 1, x % 16 == 0, -(2**31) <= x < 2**31


@gluon.jit
def _gl_rope_tables(rope, ROWS: gl.constexpr, HALF: gl.constexpr, row0, N, batch):
    """RoPE's cos and sin for ROWS rows of a tile from row0 on ([ROWS, HALF] each, fp32; the
    forward's Q, the backward's K), loaded before the tile arrives so that their latency hides
    under its TMA load. rope = (cos, sin, rows): the launcher's [*, D/2] tables, row r of the
    tile (of sequence `batch`) at table row batch * rows + row0 + r (rows from N on, past a
    sequence's end, read row0 + r = N - 1): rows = 0 for tables by position, N for per-call
    tables of [B, N] positions."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    cols = gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    rows = gl.minimum(row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout)), N - 1)
    return _gl_rope_at(rope, rows, cols, batch)


@gluon.jit
def _gl_rope_at(rope, rows, cols, batch):
    """RoPE's cos and sin (fp32) at rows[:, None] of sequence `batch` and channel pairs
    cols[None, :] (all of them, [0, D/2): rows and cols in the layout wanted): rope = (cos, sin,
    rows), the launcher's [*, D/2] tables, row r of sequence b at table row b * rows + r."""
    cos_ptr, sin_ptr, table_rows = rope
    idx = (rows + batch * table_rows)[:, None] * cols.shape[0] + cols[None, :]
    return gl.load(cos_ptr + idx), gl.load(sin_ptr + idx)


@gluon.jit
def _gl_rows_prologue(tile, trig, norm):
    """Q's or K's transforms on a consumer's rows of a tile in shared memory, in fp32, rounded
    once to the tile's dtype (as the generic kernels' pre-rotation), then fenced for the wgmmas
    that read the tile. norm = (weight or None, eps or None): RMSNorm over the head dim (with eps
    None, none); trig = (cos, sin) of `_gl_rope_tables` or (None, None): RoPE pairing channel c
    with c + D/2, every channel rotated."""
    HALF: gl.constexpr = tile.shape[1] // 2
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    lo = tile.slice(0, HALF, dim=1)
    hi = tile.slice(HALF, HALF, dim=1)
    x1 = lo.load(layout).to(gl.float32)
    x2 = hi.load(layout).to(gl.float32)
    cols = gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    w_ptr, eps = norm
    if eps is not None:
        rstd = gl.rsqrt((gl.sum(x1 * x1, axis=1) + gl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        x1 = x1 * rstd[:, None]
        x2 = x2 * rstd[:, None]
        if w_ptr is not None:
            x1 = x1 * gl.load(w_ptr + cols).to(gl.float32)[None, :]
            x2 = x2 * gl.load(w_ptr + HALF + cols).to(gl.float32)[None, :]
    cos, sin = trig
    if cos is not None:
        x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    lo.store(x1.to(tile.dtype))
    hi.store(x2.to(tile.dtype))
    fence_async_shared()
    gl.thread_barrier()
