"""64-bit addressing in the generated kernels (issue 10, item 3).

A tensor may hold more than 2^31 elements (a KV cache of B=5, H=32, N=128k, D=128), so
an offset that grows with the tensor (batch x stride, head x stride, a block's first
row x stride, an extra tensor's index x stride) must be computed in int64. The CPU
cannot allocate such tensors in a test, so this checks the lowered tl IR of every
kernel instead: each multiplication by a stride (or by NQ, NK) whose other operand
depends on the program's ids, the KV loop's index or loaded data is int64. Offsets
within a tile (aranges of the block size, channels) may stay int32. The GPU runs the
real thing: test_gpu.py::test_tensor_past_2_31_elements.
"""

from __future__ import annotations

import pytest
from kernel_harness import variant
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, i64
from xdsl.ir import Block, BlockArgument, OpResult, SSAValue

from attnfuse.dialects import tl
from attnfuse.ir import parse_module
from attnfuse.pipeline import AttnFusePipelinePass

ROPE = "attn.rope {x} half theta = 10000.0 rotary_dim = 32"
EXTRACT_2D = """attn.bias {s} custom(%tb : tensor<?x?xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<?x?xf32>):
    %x = attn.extract %t[%qi, %ki] : tensor<?x?xf32>
    attn.yield %x : f32
  }"""
LENGTHS = """attn.mask {s} custom(%lens : tensor<?xi32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %l: tensor<?xi32>):
    %n = attn.extract %l[%b] : tensor<?xi32>
    %keep = arith.cmpi slt, %ki, %n : i32
    attn.yield %keep : i1
  }"""

VARIANTS = {
    "causal_gqa": (variant(hq=4, hkv=2, score_ops=["attn.mask {s} causal"]), {}),
    "rope_prerotate": (
        variant(q_ops=[ROPE], k_ops=[ROPE], score_ops=["attn.mask {s} causal"]),
        {"rope_mode": "prerotate"},
    ),
    "rope_fused_norm": (
        variant(q_ops=["attn.norm {x} eps = 1.0e-06", ROPE], k_ops=["attn.norm {x} eps = 1.0e-06", ROPE]),
        {"rope_mode": "fused"},
    ),
    "document": (
        variant(
            score_ops=["attn.mask {s} document(%ids : tensor<?x?xi32>)"],
            extras=["%ids: tensor<?x?xi32>"],
        ),
        {},
    ),
    "alibi_sink": (
        variant(
            score_ops=["attn.bias {s} alibi(%sl : tensor<2xf32>)", "attn.mask {s} causal"],
            softmax="sink(%sk : tensor<2xf32>)",
            extras=["%sl: tensor<2xf32>", "%sk: tensor<2xf32>"],
        ),
        {},
    ),
    "extract": (
        variant(score_ops=[EXTRACT_2D, LENGTHS], extras=["%tb: tensor<?x?xf32>", "%lens: tensor<?xi32>"]),
        {},
    ),
}


def lowered(ir: str, **options) -> ModuleOp:
    module = parse_module(ir)
    AttnFusePipelinePass(sm=0, **options).apply(Context(), module)
    return module


def grows(value: SSAValue, kernel_block: Block, memo: dict[SSAValue, bool]) -> bool:
    """Whether `value` may grow with the tensors' sizes: it depends on a program id, a
    loop's index or carried values, or loaded data (kernel arguments and aranges of
    constexpr sizes do not)."""
    if value in memo:
        return memo[value]
    memo[value] = False  # no cycles in SSA form, but stay finite
    if isinstance(value, BlockArgument):
        result = value.block is not kernel_block  # a tl.for's index or carried value
    else:
        assert isinstance(value, OpResult)
        op = value.op
        result = isinstance(op, tl.ProgramIdOp | tl.LoadOp) or any(grows(o, kernel_block, memo) for o in op.operands)
    memo[value] = result
    return result


def narrow_offsets(module: ModuleOp) -> list[str]:
    """The multiplications by a stride, NQ or NK computed in int32 though their other
    operand grows, as `kernel: lhs * rhs`."""
    found = []
    for kernel in module.walk():
        if not isinstance(kernel, tl.KernelOp):
            continue
        block = kernel.body.block
        sizes = {
            a for a in block.args if a.name_hint and (a.name_hint.startswith("stride_") or a.name_hint in ("NQ", "NK"))
        }
        memo: dict[SSAValue, bool] = {}
        for op in kernel.walk():
            if not isinstance(op, tl.MulOp):
                continue
            for size, other in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
                if size in sizes and grows(other, block, memo) and tl.scalar_of(op.result.type) != i64:
                    found.append(f"{kernel.sym_name.data}: {other.name_hint or other} * {size.name_hint}")
    return found


@pytest.mark.parametrize("name", list(VARIANTS))
def test_growing_offsets_are_int64(name):
    ir, options = VARIANTS[name]
    module = lowered(ir, **options)
    kernels = [op.sym_name.data for op in module.walk() if isinstance(op, tl.KernelOp)]
    if name == "rope_prerotate":
        assert kernels == ["rotate_k", "attn_fwd"]
    assert narrow_offsets(module) == []


def test_tile_offsets_stay_int32():
    """The cost stays small: K's and V's tiles are addressed from an int64 scalar base
    plus int32 offsets within the block."""
    module = lowered(VARIANTS["causal_gqa"][0])
    kernel = next(op for op in module.walk() if isinstance(op, tl.KernelOp))
    args = list(kernel.body.block.args)
    row_stride = args[[a.name_hint for a in args].index("k") + 3]  # k, then its strides 0..3
    muls = [op for op in kernel.walk() if isinstance(op, tl.MulOp) and row_stride in op.operands]
    tiles = [op for op in muls if tl.is_tile(op.result.type)]
    assert tiles and all(tl.scalar_of(op.result.type) != i64 for op in tiles)
    assert all(tl.scalar_of(op.result.type) == i64 for op in muls if op not in tiles)


def test_the_check_finds_int32_offsets():
    """The check itself: `b * stride` on an int32 batch index is reported."""
    module = lowered(VARIANTS["causal_gqa"][0])
    kernel = next(op for op in module.walk() if isinstance(op, tl.KernelOp))
    b = next(op.results[0] for op in kernel.walk() if op.results and op.results[0].name_hint == "b")
    stride = next(a for a in kernel.body.block.args if a.name_hint == "stride_q")
    kernel.body.block.add_op(tl.MulOp(b, stride))
    assert narrow_offsets(module) == ["attn_fwd: b * stride_q"]
