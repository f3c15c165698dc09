"""The sm90 Gluon kernel library (`attnfuse/targets/triton/gluon_sm90.py`) without a GPU: it
compiles for sm 90 (Triton's own compiler and ptxas, no driver needed) within Hopper's shared
memory, its per-call check (`_gluon_fits`) accepts exactly the calls it covers, and generated
modules carry it verbatim. Its results are test_gpu_gluon.py's (on the H200)."""

from __future__ import annotations

import ast

import pytest
import torch
from kernel_harness import CUSTOM_MASK, compile_for_sm90

from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.targets.triton import gluon_launch, gluon_sm90, prelude
from attnfuse.targets.triton.printer import gluon_source

HOPPER_SMEM = 227 * 1024  # bytes of shared memory a CTA may use on sm 90


class _Capture:
    """Stands in for a Gluon kernel: records the arguments of `kernel[grid](...)` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid: tuple):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _check_sm90_binary(kernel) -> None:
    assert 0 < kernel.metadata.shared <= HOPPER_SMEM
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx  # async wgmma, TMA loads
    assert "setmaxnreg" in ptx  # warp-specialized partitions with their own register budgets


@pytest.mark.parametrize(
    "dtype,head_d,causal,n,consumers",
    [
        (torch.bfloat16, 128, True, 256, 2),
        (torch.float16, 64, False, 256, 2),
        (torch.float16, 64, True, 4096, 3),
        (torch.bfloat16, 256, True, 1024, 1),
    ],
    ids=["bf16-d128-causal", "f16-d64-short", "f16-d64-causal-192-rows", "bf16-d256-short-64-rows"],
)
def test_kernel_compiles_for_sm90(
    dtype: torch.dtype, head_d: int, causal: bool, n: int, consumers: int, monkeypatch
) -> None:
    """Each consumer schedule: at head dim 64, two warpgroups up to N = 2048, three past it; at
    256, one up to N = 1024, two past it."""
    capture = _Capture()
    monkeypatch.setattr(gluon_launch, "attn_fwd_sm90", capture)
    monkeypatch.setattr(gluon_launch, "_GL_BINARIES", {})
    q, k, v = (torch.zeros(1, h, n, head_d, dtype=dtype) for h in (4, 2, 2))
    gluon_launch._gluon_attention(q, k, v, torch.empty_like(q), torch.empty(4 * n), 0.125, causal)
    ((args, kwargs),) = capture.calls
    monkeypatch.undo()
    assert kwargs["CONSUMERS"] == consumers
    _check_sm90_binary(compile_for_sm90(gluon_sm90.attn_fwd_sm90, args, kwargs, num_warps=kwargs["num_warps"]))


@pytest.mark.parametrize("head_d,block", [(128, 128), (64, 0)], ids=["d128-block128", "d64-per-tensor"])
def test_fp8_kernel_compiles_for_sm90(head_d: int, block: int, monkeypatch) -> None:
    # e4m3 q, k and channel-major v (a transposed view), bf16 out: the products are e4m3 wgmmas.
    capture = _Capture()
    monkeypatch.setattr(gluon_launch, "attn_fwd_sm90", capture)
    monkeypatch.setattr(gluon_launch, "_GL_BINARIES", {})
    e4m3 = torch.float8_e4m3fn
    q, k = torch.zeros(1, 4, 256, head_d, dtype=e4m3), torch.zeros(1, 2, 256, head_d, dtype=e4m3)
    v = torch.zeros(1, 2, head_d, 256, dtype=e4m3).transpose(2, 3)
    scales = (torch.ones(8), torch.ones(4), torch.ones(4), block, block)
    out = torch.empty(1, 4, 256, head_d, dtype=torch.bfloat16)
    gluon_launch._gluon_attention(q, k, v, out, torch.empty(4 * 256), 0.125, True, fp8=scales)
    ((args, kwargs),) = capture.calls
    monkeypatch.undo()
    kernel = compile_for_sm90(gluon_sm90.attn_fwd_sm90, args, kwargs, num_warps=kwargs["num_warps"])
    _check_sm90_binary(kernel)
    assert ".e4m3.e4m3" in kernel.asm["ptx"]


# Score ops the generic kernel's lowering also gives the Gluon kernel, as generated functions.
_FAMILIES = {
    "rope-causal": ["attn.mask {s} causal"],  # Q's RoPE in the kernel, from the tables
    "rope-qknorm-causal": ["attn.mask {s} causal"],  # and Q's RMSNorm before it
    "rope-positions-causal": ["attn.mask {s} causal"],  # at position_ids: the per-call tables
    "rope-softcap-window": ["attn.softcap {s} cap = 50.0", "attn.mask {s} sliding_window(300)"],
    "softcap-window": ["attn.softcap {s} cap = 50.0", "attn.mask {s} sliding_window(300)"],
    "prefix-lm": ["attn.mask {s} prefix_lm(700)"],
    "softcap-no-mask": ["attn.softcap {s} cap = 2.0"],
    "alibi-causal": ["attn.bias {s} alibi(%sl : tensor<8xf32>)", "attn.mask {s} causal"],
    "document-causal": ["attn.mask {s} causal", "attn.mask {s} document(%ids : tensor<?x?xi32>)"],
    "custom-mask": [CUSTOM_MASK],  # a region reading an extra tensor (opaque to causal-split)
    "no-mask": [],  # no score ops: the kernel without hooks
}
# Each family once (a compile costs seconds); a sink (the epilogue's `_gl_sink`, the same code
# whatever the score ops) with a kernel without score functions, with one whose score functions
# keep rows that may see no key (SAFE), and with an opaque region.
_SINK = ("rope-causal", "softcap-window", "custom-mask")
_CASES = [(f, f in _SINK) for f in _FAMILIES] + [(f, False) for f in _SINK[:2]]
# A causal mask or none: no score functions.
_PLAIN = ("rope-causal", "rope-qknorm-causal", "rope-positions-causal", "no-mask")


@pytest.mark.parametrize("family,sink", _CASES, ids=[f + ("-sink" if sink else "") for f, sink in _CASES])
def test_generated_gluon_kernels_compile_for_sm90(family: str, sink: bool, tmp_path) -> None:
    """A generated module's Gluon launch (its `gluon_kv_range` and score functions, their
    extra arguments, a sink, Q's RoPE tables) as the launcher makes it, compiled for sm 90."""
    from kernel_harness import variant

    from attnfuse.cache import load_source

    ops = _FAMILIES[family]
    extras = [
        e
        for e in ("%sl: tensor<8xf32>", "%ids: tensor<?x?xi32>", "%t: tensor<?xi32>")
        if e.split(":")[0] + " :" in str(ops)
    ]
    softmax = ""
    if sink:
        extras.append("%sk: tensor<8xf32>")
        softmax = "sink(%sk : tensor<8xf32>)"
    rope = ["attn.rope {x} half theta = 10000.0 rotary_dim = 128"] if family.startswith("rope") else []
    tables = "rope_0_cos, rope_0_sin, 0"
    if "positions" in family:
        rope = [rope[0] + " positions(%qp : tensor<?x?xi64>)"]
        extras.append("%qp: tensor<?x?xi64>")
        tables = "rope_at_0_cos, rope_at_0_sin, qp_shape[1]"
    if "qknorm" in family:
        rope = ["attn.norm {x} eps = 1.0e-06", *rope]
    ir = variant(
        dtype=torch.bfloat16, hq=8, hkv=2, d=128, q_ops=rope, k_ops=rope, score_ops=ops, softmax=softmax, extras=extras
    )
    source = compile_module(parse_module(ir), sm=90, seq_len=4096).source
    plain = family in _PLAIN
    assert ("hooks=(gluon_kv_range, " in source) is not plain
    assert "rotate_q" not in source and (f"rope=({tables})" in source) is bool(rope)
    assert ("q_norm=(None, 1e-06)" in source) is ("qknorm" in family)
    module = load_source(source, tmp_path, interpret=False)
    real, capture = module.attn_fwd_sm90, _Capture()
    module.attn_fwd_sm90 = capture
    module._gluon_fits = lambda *args: True
    module._launch = lambda *args: None  # K's pre-rotation (a Triton kernel: no GPU here)
    q, k, v = (torch.zeros(2, h, 256, 128, dtype=torch.bfloat16) for h in (8, 2, 2))
    args = {
        "%sl": torch.ones(8),
        "%ids": torch.zeros(2, 256, dtype=torch.int32),
        "%t": torch.zeros(256, dtype=torch.int32),
        "%sk": torch.zeros(8),
        "%qp": torch.zeros(2, 256, dtype=torch.int64),
    }
    module.launch(q, k, v, *(args[e.split(":")[0]] for e in extras))
    ((launch_args, kwargs),) = capture.calls
    if not plain:
        assert kwargs["RANGE"] is module.gluon_kv_range and kwargs["SCORE_MASKED"] is not None
    assert (launch_args[5] is not None) is sink  # sink_ptr
    assert (launch_args[6] is not None) is bool(rope)  # cos_ptr
    assert launch_args[8] == (256 if "positions" in family else 0)  # rope_rows: the tables' rows per sequence
    assert (launch_args[10] is not None) is ("qknorm" in family)  # qn_eps
    _check_sm90_binary(compile_for_sm90(real, launch_args, kwargs, num_warps=kwargs["num_warps"]))


@pytest.mark.parametrize(
    "score_ops,rope",
    [(["attn.mask {s} causal"], True), (["attn.softcap {s} cap = 50.0", "attn.mask {s} sliding_window(300)"], False)],
    ids=["rope-causal", "gemma2-softcap-window"],
)
def test_head_dim_256_compiles_for_sm90(score_ops: list[str], rope: bool, tmp_path) -> None:
    # Head dim 256 (Gemma 2 and 3), chosen by default: 64-key K/V blocks in a 2-deep ring,
    # the Q tile's RoPE in the consumers; within an SM's shared memory, no spills.
    from kernel_harness import variant

    from attnfuse.cache import load_source

    q_ops = ["attn.rope {x} half theta = 10000.0 rotary_dim = 256"] if rope else []
    ir = variant(dtype=torch.bfloat16, hq=16, hkv=8, d=256, q_ops=q_ops, k_ops=q_ops, score_ops=score_ops)
    source = compile_module(parse_module(ir), sm=90, seq_len=4096).source
    assert "_gluon_attention(" in source
    module = load_source(source, tmp_path, interpret=False)
    real, capture = module.attn_fwd_sm90, _Capture()
    module.attn_fwd_sm90 = capture
    module._gluon_fits = lambda *args: True
    module._launch = lambda *args: None  # K's pre-rotation (a Triton kernel: no GPU here)
    q, k = torch.zeros(1, 16, 256, 256, dtype=torch.bfloat16), torch.zeros(1, 8, 256, 256, dtype=torch.bfloat16)
    module.launch(q, k, k)
    ((launch_args, kwargs),) = capture.calls
    assert kwargs["STAGES"] == 2 and launch_args[1].block_shape == [64, 256]
    kernel = compile_for_sm90(real, launch_args, kwargs, num_warps=kwargs["num_warps"])
    _check_sm90_binary(kernel)


def _qkv(nq: int, nk: int, offset: int = 0) -> list[torch.Tensor]:
    flat = torch.zeros(8 * nq * 64 + offset, dtype=torch.float16)
    q = flat[offset:].view(1, 8, nq, 64)
    return [q, torch.zeros(1, 2, nk, 64, dtype=torch.float16), torch.zeros(1, 2, nk, 64, dtype=torch.float16)]


@pytest.mark.parametrize(
    "nq,nk,offset,min_len,fits",
    [
        (2048, 2048, 0, 2048, True),
        (4096, 4096, 0, 2048, True),
        (1024, 1024, 0, 2048, False),  # below min_len
        (1024, 1024, 0, 512, True),
        (2000, 2000, 0, 128, False),  # not a multiple of 128
        (1024, 2048, 0, 128, False),  # Nq != Nk
        (2048, 2048, 1, 2048, False),  # q 2 bytes off a 16-byte boundary
        (2048, 2048, 8, 2048, True),  # 16 bytes off: aligned
    ],
)
def test_gluon_fits(nq: int, nk: int, offset: int, min_len: int, fits: bool) -> None:
    assert gluon_launch._gluon_fits(*_qkv(nq, nk, offset), min_len) is fits


def _writing_kernel(seen: list):
    class Kernel:  # writes 0, 1, 2, ... into the O descriptor's 2-D view
        def __getitem__(self, grid):
            def run(q_desc, k_desc, v_desc, o_desc, *args, **kwargs):
                seen.append(((q_desc.base, k_desc.base, v_desc.base, o_desc.base), kwargs["INNER"]))
                o_desc.base.copy_(torch.arange(o_desc.base.numel()).view(o_desc.base.shape))

            return run

    return Kernel()


def test_the_hugging_face_layout_is_read_and_written_in_place(monkeypatch) -> None:
    """q, k and v as transformers hands them over (transpose(1, 2) of [B, N, H, D] tensors) and an
    output laid out in q's order (`_empty_ordered`): the descriptors view each as [B * N, H * D]
    in place (no copy) and the kernel is told so (`INNER`); row n of head h is row n, columns
    h * D.. of that view."""
    seen: list = []
    monkeypatch.setattr(gluon_launch, "attn_fwd_sm90", _writing_kernel(seen))
    monkeypatch.setattr(gluon_launch, "_GL_BINARIES", {})
    q, k, v = (torch.zeros(1, 256, h, 64, dtype=torch.float16).transpose(1, 2) for h in (4, 2, 2))
    out = prelude._empty_ordered(q, (1, 4, 256, 64), torch.float16, q.device)
    assert not out.is_contiguous() and out.transpose(1, 2).is_contiguous()
    gluon_launch._gluon_attention(q, k, v, out, torch.empty(4 * 256), 0.125, True)
    ((bases, inner),) = seen
    assert inner == (True, True, True, True)
    for base, x in zip(bases, (q, k, v, out), strict=True):
        assert base.data_ptr() == x.data_ptr() and base.shape == (256, x.shape[1] * 64)
    want = torch.arange(256 * 256).view(1, 256, 4, 64).transpose(1, 2).to(torch.float16)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_the_fp8_form_writes_an_output_in_the_hugging_face_layout_in_place(monkeypatch) -> None:
    """The FP8 form's q, k and v are its quantization kernels' buffers; its output, laid out in the
    order of a transformers q, is written in place like the 16-bit form's (`INNER` says so)."""
    seen: list = []
    monkeypatch.setattr(gluon_launch, "attn_fwd_sm90", _writing_kernel(seen))
    monkeypatch.setattr(gluon_launch, "_GL_BINARIES", {})
    e4m3 = torch.float8_e4m3fn
    q, k = torch.zeros(1, 4, 256, 64, dtype=e4m3), torch.zeros(1, 2, 256, 64, dtype=e4m3)
    v = torch.zeros(1, 2, 64, 256, dtype=e4m3).transpose(2, 3)
    scales = (torch.ones(4), torch.ones(4), torch.ones(4), 0, 0)
    hf_q = torch.zeros(1, 256, 4, 64, dtype=torch.bfloat16).transpose(1, 2)
    out = prelude._empty_ordered(hf_q, (1, 4, 256, 64), torch.bfloat16, hf_q.device)
    gluon_launch._gluon_attention(q, k, v, out, torch.empty(4 * 256), 0.125, True, fp8=scales)
    (((_, _, _, o_base), inner),) = seen
    assert inner == (False, False, False, True) and o_base.data_ptr() == out.data_ptr()
    want = torch.arange(256 * 256).view(1, 256, 4, 64).transpose(1, 2).to(torch.bfloat16)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_an_output_in_another_layout_is_written_through_a_contiguous_buffer(monkeypatch) -> None:
    """An output neither contiguous nor in the Hugging Face order gets what the kernel wrote into a
    contiguous [B * H * N, D] buffer, copied; a k in no such order is copied before."""
    seen: list = []
    monkeypatch.setattr(gluon_launch, "attn_fwd_sm90", _writing_kernel(seen))
    monkeypatch.setattr(gluon_launch, "_GL_BINARIES", {})
    q, v = (torch.zeros(1, h, 256, 64, dtype=torch.float16) for h in (4, 2))
    k = torch.zeros(1, 2, 64, 256, dtype=torch.float16).transpose(2, 3)
    out = torch.empty(1, 4, 64, 256, dtype=torch.float16).transpose(2, 3)
    gluon_launch._gluon_attention(q, k, v, out, torch.empty(4 * 256), 0.125, True)
    (((_, k_base, _, buffer), inner),) = seen
    assert inner == (False, False, False, False)
    assert buffer.is_contiguous() and buffer.data_ptr() != out.data_ptr() and k_base.data_ptr() != k.data_ptr()
    want = torch.arange(4 * 256 * 64).view(1, 4, 256, 64).to(torch.float16)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_later_calls_run_the_c_launcher_with_tensor_maps_made_once_per_buffer(monkeypatch) -> None:
    """After a binary's first launch, `_gluon_attention` calls Triton's C launcher itself (read from
    the closure of Triton's own `wrap_handle_tensordesc`), with the four descriptors expanded as
    Triton would (`make_tensordesc_arg`), each made once per buffer address and geometry."""
    from triton.backends.nvidia import driver

    launched, maps = [], []
    meta = [{"swizzle": i} for i in range(4)]
    signature = {i: "tensordesc<bf16[64, 128]>" if i < 4 else "*fp32" for i in range(6)}

    class Binary:
        function, packed_metadata = "cufunction", "packed"

        class run:  # Triton's launcher object: the wrapped C launcher, no scratch
            launch = driver.wrap_handle_tensordesc(lambda *a: launched.append(a), signature, meta)
            global_scratch_size = profile_scratch_size = 0
            launch_cooperative_grid, launch_pdl = False, True

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: Binary()

    def tensor_map(desc, m):
        maps.append((desc.base.data_ptr(), m))
        return [f"map{len(maps)}", *desc.shape, *desc.strides]

    monkeypatch.setattr(gluon_launch, "attn_fwd_sm90", Kernel())
    monkeypatch.setattr(gluon_launch, "_GL_BINARIES", {})
    monkeypatch.setattr(gluon_launch, "_GL_MAPS", {})
    monkeypatch.setattr(driver, "make_tensordesc_arg", tensor_map)
    monkeypatch.setattr(prelude, "_DRIVER", [lambda: 0, lambda device: f"stream-of-{device}"])
    q, k, v = (torch.zeros(1, h, 256, 128, dtype=torch.bfloat16) for h in (4, 2, 2))
    out, lse = torch.empty_like(q), torch.empty(4 * 256)
    call = lambda out: gluon_launch._gluon_attention(q, k, v, out, lse, 0.125, True)  # noqa: E731
    call(out)  # compiles (here: the stand-in) through Triton's path
    assert launched == [] and maps == []
    call(out)
    ((*head, q_map, qn, qd, qs0, qs1, k_map), *_) = [launched[0][:19]]
    assert tuple(head) == (4, 2, 1, "stream-of-0", "cufunction", False, True, None, None, "packed", None, None, None)
    assert (q_map, qn, qd, qs0, qs1, k_map) == ("map1", 4 * 256, 128, 128, 1, "map2")
    assert [m for _, m in maps] == meta and maps[0][0] == q.data_ptr() and maps[3][0] == out.data_ptr()
    assert launched[0][13 + 4 * 5 :][:2] == (lse, None)  # then the kernel's other arguments
    call(out)  # the same buffers: no new tensor map
    assert len(launched) == 2 and launched[1] == launched[0] and len(maps) == 4
    call(torch.empty_like(q))  # a new output buffer: its own map
    assert len(launched) == 3 and len(maps) == 5
    # The same address with another geometry (two of the four heads) or box is another tensor map.
    layout = gluon_launch._gl_layouts(128, torch.bfloat16)[0]
    gluon_launch._gl_tma_args(q[:, :2], 128, 64, 128, layout, meta[0])
    gluon_launch._gl_tma_args(q, 128, 128, 128, layout, meta[0])
    assert len(maps) == 7 and maps[5][0] == maps[6][0] == q.data_ptr()


def test_generated_modules_carry_the_library() -> None:
    ir = (
        "func.func @f(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>)"
        " -> tensor<?x8x?x128xbf16> {\n"
        "  %s = attn.qk %q, %k : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>\n"
        "  %m = attn.mask %s causal : !attn.scores<8>\n"
        "  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>\n"
        "  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>\n"
        "  func.return %o : tensor<?x8x?x128xbf16>\n}\n"
    )
    source = compile_module(parse_module(ir), sm=90, seq_len=4096).source
    assert gluon_source() in source and gluon_source().startswith("import functools\n")
    tree = ast.parse(source)
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"attn_fwd_sm90", "_gluon_fits", "_gluon_attention", "attn_fwd", "launch"} <= names
    assert "if _gluon_fits(q, k, v, 512):" in source  # the forward: min-len-fwd
    # The generic kernel alone, where kernel-path does not choose the Gluon kernel.
    for sm, seq_len in ((80, 4096), (90, 256), (0, 4096)):
        assert "gluon" not in compile_module(parse_module(ir), sm=sm, seq_len=seq_len).source


def _stand_in(calls: list):
    """A float64 `_gluon_attention` (same contract) for the CPU: what the launcher hands the Gluon
    kernel (Q and K transformed or Q's RoPE tables, the score scale) is then checked end to end
    by the reference."""

    def attention(q, k, v, out, lse, qk_scale, causal, rope=None, q_norm=None):
        calls.append(qk_scale)
        x = q.double()
        if q_norm is not None:  # as _gl_q_prologue: RMSNorm over the head dim, then the weight
            weight, eps = q_norm
            x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
            x = x * weight.double() if weight is not None else x
        if rope is not None:  # row n of sequence b reads table row b * rows + n; c paired with c + D/2
            cos_t, sin_t, rows = rope
            at = torch.arange(q.shape[0])[:, None] * rows + torch.arange(q.shape[2])[None, :]
            cos, sin = (t[at][:, None].double() for t in (cos_t, sin_t))
            x1, x2 = x.chunk(2, dim=-1)
            x = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        q = x.to(q.dtype)
        group = q.shape[1] // k.shape[1]
        kk, vv = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
        s = q.double() @ kk.transpose(-1, -2) * qk_scale
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.copy_((s.softmax(-1) @ vv).to(out.dtype))
        lse.view(-1)[: s[..., 0].numel()] = s.logsumexp(-1).float().reshape(-1)
        return out

    return attention


@pytest.mark.parametrize("transforms", ["rope", "qknorm_rope", "qknorm_rope_positions", "none"])
def test_the_gluon_branch_hands_the_kernel_transformed_q_and_k(transforms: str, tmp_path) -> None:
    """The sm90 launcher's Gluon branch under the interpreter, with a float64 stand-in for the
    Gluon kernel: the Q transforms it leaves the kernel (RoPE; RMSNorm with weights then RoPE,
    from tables by position or, at explicit positions, the per-call tables) and the scale it
    passes give the reference's output and lse."""
    from kernel_harness import variant

    from attnfuse.cache import interpreter_library, load_source
    from attnfuse.reference import run_reference_with_lse

    rope = "attn.rope {x} half theta = 10000.0 rotary_dim = 64"
    pieces: dict = {"score_ops": ["attn.mask {s} causal"], "qk": "scale = 0.3"}
    g = torch.Generator().manual_seed(3)
    n = 64
    q, k, v = (torch.randn(1, h, n, 64, generator=g).half() for h in (4, 2, 2))
    extras: list[torch.Tensor] = []
    if transforms == "rope":
        pieces |= {"q_ops": [rope], "k_ops": [rope]}
    elif transforms == "qknorm_rope":
        pieces |= {
            "q_ops": ["attn.norm {x} eps = 1.0e-06 weight(%wq : tensor<64xf32>)", rope],
            "k_ops": ["attn.norm {x} eps = 1.0e-06 weight(%wk : tensor<64xf32>)", rope],
            "extras": ["%wq: tensor<64xf32>", "%wk: tensor<64xf32>"],
        }
        extras = [1 + 0.3 * torch.randn(64, generator=g), 1 + 0.3 * torch.randn(64, generator=g)]
    elif transforms == "qknorm_rope_positions":
        at = "attn.rope {x} half theta = 10000.0 rotary_dim = 64 positions(%pos : tensor<?x?xi64>)"
        pieces |= {
            "q_ops": ["attn.norm {x} eps = 1.0e-06 weight(%wq : tensor<64xf32>)", at],
            "k_ops": ["attn.norm {x} eps = 1.0e-06 weight(%wk : tensor<64xf32>)", at],
            "extras": ["%wq: tensor<64xf32>", "%wk: tensor<64xf32>", "%pos: tensor<?x?xi64>"],
        }
        extras = [1 + 0.3 * torch.randn(64, generator=g), 1 + 0.3 * torch.randn(64, generator=g)]
        extras.append(torch.randperm(1000, generator=g)[: 2 * n].sort().values.view(2, n).long())
        q, k, v = (torch.cat([x, torch.randn(x.shape, generator=g).half()]) for x in (q, k, v))
    ir = variant(dtype=torch.float16, hq=4, hkv=2, d=64, **pieces)
    source = compile_module(
        parse_module(ir), sm=90, seq_len=4096, gluon_head_dims=(64,), gluon_min_len_transformed=2048
    ).source
    # QK-norm and RoPE (by position, or at explicit positions from the per-call tables) are the
    # Gluon kernel's own.
    assert "rotate_q" not in source
    assert ("rope=(rope_0_cos, rope_0_sin, 0)" in source) is (transforms in ("rope", "qknorm_rope"))
    assert ("_sin, pos_shape[1])" in source) is (transforms == "qknorm_rope_positions")
    assert ("q_norm=(wq, 1e-06)" in source) is transforms.startswith("qknorm_rope")
    module = load_source(source, tmp_path, interpret=True)
    calls: list[float] = []
    module._gluon_attention = _stand_in(calls)
    module._gluon_fits = lambda *args: True  # a short sequence, to keep the interpreter fast
    with interpreter_library():
        out, lse = module.launch(q, k, v, *extras)
    assert calls == [pytest.approx(0.3)]
    ref, ref_lse = run_reference_with_lse(ir, q, k, v, *extras)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-2)
