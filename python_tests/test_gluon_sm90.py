"""The sm90 Gluon kernel library (`attnfuse/targets/triton/gluon_sm90.py`) without a GPU: it
compiles for sm 90 (Triton's own compiler and ptxas, no driver needed) within Hopper's shared
memory, its per-call check (`_gluon_fits`) accepts exactly the calls it covers, and generated
modules carry it verbatim. Its results are test_gpu_gluon.py's (on the H200)."""

from __future__ import annotations

import ast

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.targets.triton import gluon_sm90
from attnfuse.targets.triton.printer import gluon_source

HOPPER_SMEM = 227 * 1024  # bytes of shared memory a CTA may use on sm 90


@pytest.mark.parametrize(
    "dtype,head_d,causal",
    [(torch.bfloat16, 128, True), (torch.float16, 64, False)],
    ids=["bf16-d128-causal", "f16-d64"],
)
def test_kernel_compiles_for_sm90(dtype: torch.dtype, head_d: int, causal: bool) -> None:
    q_layout, kv_layout, o_layout = gluon_sm90._gl_layouts(head_d, dtype)
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    signature = {
        "q_desc": f"tensordesc<{name}[128,{head_d}],{q_layout!r}>",
        "k_desc": f"tensordesc<{name}[128,{head_d}],{kv_layout!r}>",
        "v_desc": f"tensordesc<{name}[128,{head_d}],{kv_layout!r}>",
        "o_desc": f"tensordesc<{name}[64,{head_d}],{o_layout!r}>",
        "lse_ptr": "*fp32",
        "qk_scale": "fp32",
        "N": "i32",
        "GROUP": "i32",
        "CAUSAL": "constexpr",
        "STAGES": "constexpr",
    }
    source = GluonASTSource(gluon_sm90.attn_fwd_sm90, signature, constexprs={(8,): causal, (9,): 3})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert 0 < kernel.metadata.shared <= HOPPER_SMEM
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx  # async wgmma, TMA loads
    assert "setmaxnreg" in ptx  # warp-specialized partitions with their own register budgets


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
    assert gluon_sm90._gluon_fits(*_qkv(nq, nk, offset), min_len) is fits


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
    assert "if _gluon_fits(q, k, v, 2048):" in source
    # The generic kernel alone, where kernel-path does not choose the Gluon kernel.
    for sm, seq_len in ((80, 4096), (90, 1024), (0, 4096)):
        assert "gluon" not in compile_module(parse_module(ir), sm=sm, seq_len=seq_len).source
