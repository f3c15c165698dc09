# type: ignore
"""The host side of the sm90 Gluon attention kernel (`gluon_sm90.py`): `_gluon_attention`, which
a generated launcher's `tl.gluon_attention` op calls.

Generated modules carry this file's code after the kernel's (`printer.GLUON_FILES`); here it is an
ordinary module, tested on the CPU with the kernel captured instead of launched.

A call builds the kernel's four TMA descriptors (Q, K, V and O as [rows, D] views) and launches
the binary compiled for what Triton specialises it on (`_gl_spec`). After the first call with a
given key the binary runs through Triton's C launcher itself, with each descriptor's launch
arguments (the CUDA tensor map and the view's shape and strides) made once per buffer address,
shape, strides and box (`_gl_tma_args`): building a descriptor and its tensor map is several
microseconds of host time, four times a call. Launch hooks (profilers) take Triton's own path.
"""

# Host code in the Gluon kernel's style (module-level caches, no annotations); pyright skips it.

import functools

import torch
from triton.experimental.gluon import language as gl

from attnfuse.targets.triton.gluon_common import _gl_desc, _gl_spec, _gl_view
from attnfuse.targets.triton.gluon_sm90 import _GL_BLOCK, _GL_LOG2E, _gl_consumers, _gl_kv_rows, attn_fwd_sm90
from attnfuse.targets.triton.prelude import _c_options, _driver, _gl_inner, _hooked

# fmt: off
_GL_BINARIES = {}


_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}


@functools.cache
def _gl_layouts(head_d, dtype, out_dtype=None):
    """The NVMMA shared layouts of a consumer's Q box, a K/V block, a consumer's O box and
    (FP8) a channel-major V block."""
    dt, ot = _GL_DTYPES[dtype], _GL_DTYPES[out_dtype or dtype]
    return (gl.NVMMASharedLayout.get_default_for([_GL_BLOCK // 2, head_d], dt),
            gl.NVMMASharedLayout.get_default_for([_gl_kv_rows(head_d)[0], head_d], dt),
            gl.NVMMASharedLayout.get_default_for([_GL_BLOCK // 2, head_d], ot),
            gl.NVMMASharedLayout.get_default_for([head_d, _GL_BLOCK], dt))


def _gluon_fits(q, k, v, min_len):
    """Whether this call can take the Gluon kernel: Nq = Nk, a multiple of 128 and at least
    min_len (below it the generic kernel's cheaper launch wins), and 16-byte aligned data
    (TMA). The compiler checked dtypes, head dims and the variant itself."""
    n = q.shape[2]
    return (n == k.shape[2] and n >= min_len and n % _GL_BLOCK == 0
            and q.data_ptr() % 16 == 0 and k.data_ptr() % 16 == 0 and v.data_ptr() % 16 == 0)


def _gluon_attention(q, k, v, out, lse, qk_scale, causal, sink=None, hooks=None, xargs=(), natural=False,
                     rope=None, q_norm=None, fp8=None):
    """`_gluon_kernel` into `out`; one neither contiguous nor with its heads inner to its
    sequence (`_gl_inner`: the kernel stores O by TMA as rows of one of those two 2-D views) is
    written through a contiguous buffer and copied."""
    if out.is_contiguous() or _gl_inner(out):
        return _gluon_kernel(q, k, v, out, lse, qk_scale, causal, sink, hooks, xargs, natural, rope, q_norm, fp8)
    out.copy_(_gluon_kernel(q, k, v, torch.empty(out.shape, dtype=out.dtype, device=out.device), lse, qk_scale,
                            causal, sink, hooks, xargs, natural, rope, q_norm, fp8))
    return out


def _gluon_kernel(q, k, v, out, lse, qk_scale, causal, sink=None, hooks=None, xargs=(), natural=False,
                  rope=None, q_norm=None, fp8=None):
    """out[B, Hq, N, D] and lse (a contiguous fp32 buffer of at least B*Hq*N elements) by
    `attn_fwd_sm90`, for q and k holding their transforms and qk_scale the score scale.
    Without `hooks`: softmax(q·kᵀ·qk_scale [causal]) v. With them, (RANGE, SCORE_FULL,
    SCORE_MASKED) generated for the variant, which read `xargs` and, when `natural`, the
    scaled scores. sink: None or the [Hq] sink logits. rope: None (q holds its transforms) or
    the (cos, sin, rows) tables [*, D/2] of the RoPE the kernel applies to q (half style, every
    channel), read at row b * rows + n for row n of sequence b (rows 0: tables by position);
    q_norm: None or the (weight or None, eps) of an RMSNorm of q before it.
    q, k, v and out are read (written) in place when contiguous or, as transformers hands them
    over, with their heads inner to their sequence (`_gl_inner`); others are copied first (TMA
    reads them as 2-D views).
    fp8: None, or q, k and v in e4m3 (v a transposed view of a contiguous [B, Hkv, D, N]) and
    (q_scale, k_scale, v_scale, q_block, kv_block): their scales per block of q_block rows of
    q (a multiple of 64) and of kv_block keys (a multiple of 128), or one per tensor (0)."""
    b, hq, n, d = q.shape
    inner = (False, False, False, _gl_inner(out))  # FP8's q, k, v: the quantization kernels' own buffers
    if fp8 is None:
        q, k, v = (x if x.is_contiguous() or _gl_inner(x) else x.contiguous() for x in (q, k, v))
        inner = tuple(_gl_inner(x) for x in (q, k, v, out))
        consumers, pingpong = _gl_consumers(d, n)
    else:
        consumers, pingpong = 2, True
    block_m = 64 * consumers
    q_layout, kv_layout, o_layout, vt_layout = _gl_layouts(d, q.dtype, out.dtype)

    fp8_scales = None
    kv_rows, stages = _gl_kv_rows(d)
    # Each descriptor as (tensor, its 2-D view's width, box rows, box columns, layout).
    v_spec = _gl_view(v, inner[2], kv_rows, kv_layout)
    if fp8 is not None:
        q_scale, k_scale, v_scale, q_block, kv_block = fp8
        # v's contiguous [B * Hkv * D, N] storage (v is its transposed view), in [D, 128] boxes.
        v_spec = (v.transpose(2, 3), n, d, _GL_BLOCK, vt_layout)
        # A per-tensor scale: 0 blocks of 2^30 rows (every row's index is 0).
        fp8_scales = (q_scale, k_scale, v_scale, -(-n // q_block) if q_block else 0, q_block or 1 << 30,
                      -(-n // kv_block) if kv_block else 0, kv_block or 1 << 30)

    group = hq // k.shape[1]
    rng, full, masked = hooks if hooks is not None else (None, None, None)
    cos, sin, rope_rows = rope if rope is not None else (None, None, 0)
    qn_w, qn_eps = q_norm if q_norm is not None else (None, None)
    if qn_w is not None and not qn_w.is_contiguous():
        qn_w = qn_w.contiguous()
    if sink is not None and not sink.is_contiguous():
        sink = sink.contiguous()
    mult = _GL_LOG2E if natural else qk_scale * _GL_LOG2E
    grid = (b * hq, -(-n // block_m), 1)  # three entries: a compiled binary's launcher indexes all three
    specs = (_gl_view(q, inner[0], _GL_BLOCK // 2, q_layout), _gl_view(k, inner[1], kv_rows, kv_layout), v_spec,
             _gl_view(out, inner[3], _GL_BLOCK // 2, o_layout))
    args = (lse, sink, cos, sin, rope_rows, qn_w, qn_eps, qk_scale, mult, fp8_scales, n, group, hq, xargs)
    # What Triton specialises the binary on (N is a multiple of 128, so always divisible by 16).
    key = (q.device.index, q.dtype, d, consumers, pingpong, causal, natural, hooks, group == 1, group % 16 == 0,
           _gl_spec(hq),
           lse.data_ptr() % 16 == 0, None if sink is None else _gl_spec(sink), tuple(_gl_spec(x) for x in xargs),
           rope is None, _gl_spec(rope_rows), None if qn_w is None else _gl_spec(qn_w), qn_eps is None, out.dtype,
           None if fp8_scales is None else tuple(_gl_spec(x) for x in fp8_scales), inner)
    entry = _GL_BINARIES.get(key)
    constexprs = (causal, stages, rng, full, masked, natural, consumers, pingpong, inner)
    if entry is None or entry[1] is None or _hooked():
        descs = [_gl_desc(*spec) for spec in specs]
        if entry is None:  # Triton's launch path: compiles or loads the binary
            binary = attn_fwd_sm90[grid](*descs, *args, CAUSAL=causal, STAGES=stages, RANGE=rng, SCORE_FULL=full,
                                         SCORE_MASKED=masked, NATURAL=natural, CONSUMERS=consumers,
                                         PINGPONG=pingpong, INNER=inner, num_warps=4)
            _GL_BINARIES[key] = (binary, _gl_runner(binary))
        else:  # the binary through Triton's launcher object
            entry[0][grid](*descs, *args, *constexprs)
        return out
    binary, (launch, meta, options) = entry
    get_device, get_stream = _driver()
    tma = [x for spec, m in zip(specs, meta, strict=True) for x in _gl_tma_args(*spec, m)]
    launch(*grid, get_stream(get_device()), binary.function, *options, binary.packed_metadata, None, None, None,
           *tma, *args, *constexprs)
    return out


_GL_MAPS = {}


def _gl_tma_args(t, width, rows, cols, layout, meta):
    """The launch arguments of `_gl_desc(t, ...)` (Triton's expansion of a descriptor argument:
    the CUDA tensor map, then the view's shape and strides), made once per address, shape,
    strides, dtype and box of t. The tensor map encodes only those, so a later buffer at the same
    address with the same geometry shares it; the cache holds no tensor."""
    key = (t.data_ptr(), t.shape, t.stride(), t.dtype, rows, cols)
    found = _GL_MAPS.get(key)
    if found is None:
        from triton.backends.nvidia.driver import make_tensordesc_arg

        if len(_GL_MAPS) >= 1024:
            _GL_MAPS.clear()
        found = _GL_MAPS[key] = tuple(make_tensordesc_arg(_gl_desc(t, width, rows, cols, layout), meta))
    return found


def _gl_runner(binary):
    """How later calls run a compiled `attn_fwd_sm90`: (Triton's C launcher, the metadata of its
    four tensor descriptors, the launch options that precede the kernel metadata), or None for
    Triton's launcher object. Triton's object adds scratch memory, when a binary needs it, and
    expands descriptor arguments (`wrap_handle_tensordesc`, whose C launcher and metadata this
    reads); `_gl_tma_args` does that expansion once per buffer instead."""
    try:
        run = binary.run
        wrapper = run.launch
        cells = dict(zip(wrapper.__code__.co_freevars, (c.cell_contents for c in wrapper.__closure__), strict=True))
        launch, indices, meta = cells["launcher"], cells["tensordesc_indices"], cells["tensordesc_meta"]
        if (run.global_scratch_size or run.profile_scratch_size or sorted(indices) != [0, 1, 2, 3]
                or len(meta) != 4 or any(m is None for m in meta)):
            return None
        return launch, tuple(meta), _c_options(run)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
