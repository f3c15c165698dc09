"""causal-split: classify KV blocks from the mask predicates.

For each Q block the kernel visits only KV blocks that some query of the block may
attend to (the rest are skipped), runs the blocks where every predicate holds for
every (query, key) pair without mask code (full) and masks the others (partial):
FlashAttention-2's causal split, generalised to sliding windows, prefix-LM and
their conjunctions. A predicate it cannot bound (document ids, custom regions)
makes every visited block partial: slower, never wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith
from xdsl.dialects.builtin import ArrayAttr, ModuleOp
from xdsl.ir import BlockArgument, SSAValue
from xdsl.passes import ModulePass

from attnfuse.dialects import attn
from attnfuse.passes.analysis import analyse, variant_funcs


def _is_causal_region(mask: attn.MaskOp) -> bool:
    """A custom region yielding `kv_idx <= q_idx` (or `q_idx >= kv_idx`) is causal."""
    block = mask.body.blocks[0]
    term = block.last_op
    assert isinstance(term, attn.YieldOp)
    value: SSAValue = term.values[0]
    cmp = value.owner
    if not isinstance(cmp, arith.CmpiOp):
        return False
    q_idx, kv_idx = block.args[2], block.args[3]
    lhs, rhs = cmp.lhs, cmp.rhs
    if not (isinstance(lhs, BlockArgument) and isinstance(rhs, BlockArgument)):
        return False
    pred = arith.CMPI_COMPARISON_OPERATIONS[cmp.predicate.value.data]
    return (pred == "sle" and (lhs, rhs) == (kv_idx, q_idx)) or (pred == "sge" and (lhs, rhs) == (q_idx, kv_idx))


def classify(mask: attn.MaskOp) -> attn.KvBoundAttr:
    """The KV bound of a named mask kind that has one, `causal` for a causal custom
    region, else `opaque`."""
    kind = attn.MASK_KINDS.get(mask.kind.data)
    if kind is not None and kind.kv_bounded:
        return attn.KvBoundAttr(kind.name, mask.param.value.data if mask.param is not None else None)
    if mask.kind.data == "custom" and _is_causal_region(mask):
        return attn.KvBoundAttr("causal")
    return attn.KvBoundAttr(attn.KvBoundAttr.OPAQUE)


@dataclass(frozen=True)
class CausalSplitPass(ModulePass):
    """Mark each attn.mask with `blocks` (its `#attn.kv_bound<...>`) and the function
    with `attn.kv_blocks`, the list of them: the bounded predicates whose conjunction
    decides which KV blocks are skipped, full or partial, or `opaque` when some
    predicate is not bounded (then no block is full)."""

    name = "causal-split"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in variant_funcs(op):
            v = analyse(f)
            bounds = []
            for mask in v.masks:
                bound = classify(mask)
                mask.attributes["blocks"] = bound
                bounds.append(bound)
            f.attributes["attn.kv_blocks"] = ArrayAttr(bounds)
