# type: ignore
"""The host side of the sm90 Gluon backward (`gluon_bwd_sm90.py`, `gluon_bwd_dq_sm90.py`):
`_gluon_backward`, which a generated launcher's `tl.gluon_backward` op calls, and
`_gluon_bwd_fits`, its test of a call.

Generated modules carry this file's code after the kernels' (`printer.GLUON_BWD_FILES`); here it
is an ordinary module, tested on the CPU with the kernels captured instead of launched.

A call builds the kernels' TMA descriptors (q, k, v and dO as 2-D views, contiguous or in
transformers' layout, `_gl_view`; the fp32 dQ workspace) and launches the binaries compiled for
what Triton specialises them on (`_gl_spec`), Triton's launch path the first time and the
binary directly after.
"""

# Host code in the Gluon kernels' style (module-level caches, no annotations); pyright skips it.

import functools

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from attnfuse.targets.triton.gluon_bwd_dq_sm90 import _GLBQ_ROWS, _GLBQ_SCHEDULE, attn_bwd_dq_sm90
from attnfuse.targets.triton.gluon_bwd_sm90 import _GLB_KEYS, _GLB_ROWS, _GLB_STAGES, attn_bwd_sm90
from attnfuse.targets.triton.gluon_common import _gl_desc, _gl_spec, _gl_view
from attnfuse.targets.triton.prelude import _gl_inner

# fmt: off
_GLB_BINARIES = {}
_GLB_ROWS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)


@functools.cache
def _glb_layouts(head_d, dtype):
    """The NVMMA shared layouts of a K/V block, a Q/dO block and half of a dQ share (fp32,
    swizzled: the consumers store it without bank conflicts; TMA moves it in boxes of at most 32
    columns)."""
    dt = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return (gl.NVMMASharedLayout.get_default_for([_GLB_KEYS, head_d], dt),
            gl.NVMMASharedLayout.get_default_for([_GLB_ROWS, head_d], dt),
            gl.NVMMASharedLayout.get_default_for([_GLB_ROWS, head_d // 2], gl.float32))


@functools.cache
def _glbq_layouts(head_d, dtype):
    """The dQ kernel's NVMMA shared layouts: its Q (and dO) tile and a K/V block."""
    dt = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return (gl.NVMMASharedLayout.get_default_for([_GLBQ_ROWS, head_d], dt),
            gl.NVMMASharedLayout.get_default_for([_GLBQ_SCHEDULE[head_d][0], head_d], dt))


def _glb_rows_desc(x):
    """A TMA descriptor of a per-row fp32 statistic (lse, delta: [B * Hq * N]) in blocks of one
    step's query rows."""
    flat = x.view(-1)
    return TensorDescriptor(flat, [flat.numel()], [1], [_GLB_ROWS], _GLB_ROWS_LAYOUT)


def _gluon_bwd_fits(q, k, v, dout, lse, min_len):
    """Whether this backward call can take the Gluon kernels: Nq = Nk, a multiple of 128 and at
    least min_len, a contiguous, 16-byte aligned lse (the dK/dV kernel loads it by TMA), and q,
    k, v, dout that are 16-byte aligned where contiguous (TMA reads them as [rows, D] views;
    `_gluon_backward` copies the others, e.g. the Hugging Face layout's transposed views). The
    compiler checked dtypes, head dims and the variant."""
    n = q.shape[2]
    return (n == k.shape[2] and n >= min_len and n % _GLB_KEYS == 0 and lse.is_contiguous() and lse.data_ptr() % 16 == 0
            and all(x.data_ptr() % 16 == 0 for x in (q, k, v, dout) if x.is_contiguous()))


def _gl_deterministic():
    """Whether PyTorch asks for deterministic algorithms (`torch.use_deterministic_algorithms`):
    the Gluon backward then computes dQ by its ordered kernel whatever the compiler chose."""
    return torch.are_deterministic_algorithms_enabled()


def _gluon_backward(q, k, v, dout, lse, delta, dq_acc, dk, dv, dk_scale, hooks, xargs=(), reduce_dq=False,
                    k_rope=None, apply_k_rope=False):
    """dK·dk_scale into `dk`, dV into `dv` by `attn_bwd_sm90`, and dS·K (unscaled, fp32) into
    `dq_acc`: by `attn_bwd_dq_sm90` after it (ordered: bitwise reproducible), or, when
    `reduce_dq`, by TMA reduce-adds from `attn_bwd_sm90` itself into the zeroed workspace. For
    q, k (holding their transforms), v and dout [B, H, N, D] (read in place when contiguous or
    with their heads inner to their sequence, `_gl_inner`; others are copied first), the
    forward's lse and delta [B*Hq*N] (fp32). hooks = (RANGE_Q, RANGE_KV,
    HOOK_FULL, HOOK_MASKED), the variant's generated functions (the query blocks a block of
    keys meets, the key blocks a Q tile meets, P and dS), which read `xargs`. dk is the
    gradient's dtype or fp32 (a K chain's kernel takes it from there); dk, dv contiguous or with
    their heads inner (as `_empty_ordered` lays them out for such a k and v). k_rope: None, or
    the (cos, sin, rows) tables [*, D/2] of K's RoPE (half style, every channel; read at row
    b * rows + n for key n of sequence b, rows 0: by position): dk is then the gradient of k
    before it, which the dK/dV kernel stores back through the RoPE. apply_k_rope (with k_rope): k is
    given before its RoPE, and the dK/dV kernel rotates its keys itself (and writes them out for
    the ordered dQ kernel); else k holds it."""
    q, k, v, dout = (x if x.is_contiguous() or _gl_inner(x) else x.contiguous() for x in (q, k, v, dout))
    b, hq, n, d = q.shape
    kv_layout, q_layout, dq_layout = _glb_layouts(d, q.dtype)
    inner = tuple(_gl_inner(x) for x in (q, k, v, dout, dk, dv))

    def desc(i, rows, layout):  # of (q, k, v, dout)[i]
        return _gl_desc(*_gl_view((q, k, v, dout)[i], inner[i], rows, layout))

    if reduce_dq:
        dq_acc.zero_()
    group = hq // k.shape[1]
    range_q, range_kv, full, masked = hooks
    k_cos, k_sin, k_rows = k_rope if k_rope is not None else (None, None, 0)
    k_rot = k_rot_desc = None  # the rotated keys, for the ordered dQ kernel
    if apply_k_rope and not reduce_dq:
        k_rot = torch.empty((b, k.shape[1], n, d), dtype=k.dtype, device=k.device)
        k_rot_desc = _gl_desc(*_gl_view(k_rot, False, _GLB_ROWS, q_layout))
    # Heads along the grid's first axis: every head's lowest (under a causal mask, heaviest)
    # blocks of keys start first (with the blocks along it, measured 0.63x at N = 4096 on the
    # H200: the heaviest blocks of the last heads ran in the launch's tail). Three entries: a
    # compiled binary's launcher indexes all three.
    grid = (b * k.shape[1], n // _GLB_KEYS, 1)
    args = (desc(0, _GLB_ROWS, q_layout), desc(1, _GLB_KEYS, kv_layout), desc(2, _GLB_KEYS, kv_layout),
            desc(3, _GLB_ROWS, q_layout), _gl_desc(dq_acc, d, _GLB_ROWS, d // 2, dq_layout), _glb_rows_desc(lse),
            _glb_rows_desc(delta), dk, dv, float(dk_scale), k_cos, k_sin, k_rows, k_rot_desc, n, group, hq, xargs)
    spec = (q.device.index, q.dtype, d, hooks, _gl_spec(group), _gl_spec(n), _gl_spec(hq),
            tuple(_gl_spec(x) for x in (lse, delta, dk, dv, dq_acc)), tuple(_gl_spec(x) for x in xargs))
    rope_key = k_rope is None or (_gl_spec(k_cos), _gl_spec(k_sin), _gl_spec(k_rows), apply_k_rope)
    key = ("dkdv", reduce_dq, dk.dtype, rope_key, inner, *spec)
    binary = _GLB_BINARIES.get(key)
    if binary is None:  # Triton's launch path: compiles or loads the binary
        _GLB_BINARIES[key] = attn_bwd_sm90[grid](*args, STAGES=_GLB_STAGES, RANGE=range_q, HOOK_FULL=full,
                                                 HOOK_MASKED=masked, DQ=reduce_dq, ROTATE_K=apply_k_rope, INNER=inner,
                                                 num_warps=4)
    else:  # the binary directly, without Triton's per-call argument binding
        binary[grid](*args, _GLB_STAGES, range_q, full, masked, reduce_dq, apply_k_rope, inner)
    if reduce_dq:
        return
    q_tile_layout, kv_block_layout = _glbq_layouts(d, q.dtype)
    grid = (b * hq, n // _GLBQ_ROWS, 1)
    keys, stages, pingpong = _GLBQ_SCHEDULE[d]
    if k_rot is None:
        k_desc = desc(1, keys, kv_block_layout)
    else:
        k_desc = _gl_desc(*_gl_view(k_rot, False, keys, kv_block_layout))
    inner = (inner[0], inner[1] and k_rot is None, inner[2], inner[3])
    args = (desc(0, _GLBQ_ROWS, q_tile_layout), k_desc, desc(2, keys, kv_block_layout),
            desc(3, _GLBQ_ROWS, q_tile_layout), dq_acc, lse, delta, n, group, hq, xargs)
    key = ("dq", inner, *spec)
    binary = _GLB_BINARIES.get(key)
    if binary is None:
        _GLB_BINARIES[key] = attn_bwd_dq_sm90[grid](*args, STAGES=stages, RANGE=range_kv, HOOK_FULL=full,
                                                    HOOK_MASKED=masked, PINGPONG=pingpong, INNER=inner, num_warps=4)
    else:
        binary[grid](*args, stages, range_kv, full, masked, pingpong, inner)
