"""The one place that knows the order of AttnFuse's passes.

attn IR [--attn-autodiff--> the backward's attn IR] --kernel-path--> the kernel that computes
the attention (sm90 Gluon or generic Triton) --rope-fusion--> placement of pre-matmul ops
--causal-split--> KV block classes --tiling--> tile sizes --convert-attn-to-tl--> tl IR
--(target triton)--> Python source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from attnfuse.passes.analysis import check_sm
from attnfuse.passes.attn_autodiff import AttnAutodiffPass
from attnfuse.passes.causal_split import CausalSplitPass
from attnfuse.passes.convert_attn_to_tl import ConvertAttnToTlPass
from attnfuse.passes.kernel_path import GLUON_HEAD_DIMS, KernelPathPass, TanhMode
from attnfuse.passes.rope_fusion import RopeFusionPass, RopeMode
from attnfuse.passes.tiling import TilingPass


@dataclass(frozen=True)
class AttnFusePipelinePass(ModulePass):
    """The whole lowering from attn IR to tl IR, with the options of its stages."""

    name = "attnfuse-pipeline"

    sm: int | None = None
    """Target SM version (90 = Hopper; 0 = the CPU interpreter)."""
    seq_len: int | None = None
    """Sequence length the kernel is tuned for (rope-fusion's cost model)."""
    rope_mode: RopeMode = "auto"
    """rope-fusion mode: auto, fused or prerotate (a backward always pre-rotates Q and K)."""
    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    causal_split: bool = True
    """false: leave KV blocks unclassified, so every block up to Nk is visited and
    masked (the baseline of the ablation, benchmarks/ablation.py)."""
    gluon: bool = True
    """false: the generic Triton kernel everywhere (kernel-path's option; on sm90 the Gluon
    kernel is otherwise chosen where it takes the variant)."""
    gluon_head_dims: tuple[int, ...] = GLUON_HEAD_DIMS
    """kernel-path's head-dims: the head dims the Gluon kernel is chosen for."""
    gluon_min_len: int = KernelPathPass.min_len
    """kernel-path's min-len: the shortest sequence the Gluon kernel runs (no Q transforms)."""
    gluon_min_len_fwd: int = KernelPathPass.min_len_fwd
    """kernel-path's min-len-fwd: the forward's min-len (no pre-rotation kernel), when below min-len."""
    gluon_min_len_transformed: int = KernelPathPass.min_len_transformed
    """kernel-path's min-len-transformed: the same for a variant with Q transforms."""
    tanh: TanhMode = "auto"
    """kernel-path's tanh: a softcap's or region's tanh by the GPU's approximate instruction in
    the Gluon kernel (auto), in every GPU kernel (approx) or nowhere (exact)."""
    gluon_dq_reduce: bool = KernelPathPass.dq_reduce
    """kernel-path's dq-reduce: the Gluon backward's dQ by TMA reduce-adds (not bitwise
    reproducible; the default) or (false) by its ordered dQ kernel."""
    decode: bool = False
    """kernel-path's decode: compile the forward for decoding against a KV cache (`Variant.decode`)."""
    page_size: int = 0
    """kernel-path's page-size (with `decode`): 0 for a contiguous cache, else the page size."""
    decode_splits: int = 0
    """kernel-path's splits (with `decode`): a fixed number of cache splits; 0: its cost model."""
    varlen: bool = False
    """kernel-path's varlen: compile the forward over packed sequences (`Variant.varlen`)."""
    backward: bool = False
    """Compile the backward (attn-autodiff first) instead of the forward."""
    wrt: tuple[int, ...] = ()
    """With `backward`: the arguments to differentiate (attn-autodiff's option)."""

    def apply(self, ctx: Context, op: ModuleOp, after: Callable[[str, ModuleOp], object] | None = None) -> None:
        """Run the stages of `STAGES` in order. `after(stage_name, op)`, if given, is called
        after each stage that runs (the compiler driver's per-stage IR dump uses it)."""
        if self.sm is not None:
            check_sm(self.sm, self.name)
        if self.decode and self.backward:
            raise ValueError("attnfuse-pipeline decode=true compiles a forward: it takes no backward=true")
        if self.wrt and not self.backward:
            raise ValueError(
                f"attnfuse-pipeline wrt={','.join(map(str, self.wrt))} needs backward=true: wrt picks the arguments "
                "the backward differentiates, and the forward has none"
            )
        for name, make in STAGES:
            stage = make(self)
            if stage is not None:
                stage.apply(ctx, op)
                if after is not None:
                    after(name, op)


STAGES: list[tuple[str, Callable[[AttnFusePipelinePass], ModulePass | None]]] = [
    ("attn-autodiff", lambda o: AttnAutodiffPass(wrt=o.wrt) if o.backward else None),
    (
        "kernel-path",
        lambda o: KernelPathPass(
            sm=o.sm,
            seq_len=o.seq_len,
            gluon=o.gluon,
            head_dims=tuple(o.gluon_head_dims),
            min_len=o.gluon_min_len,
            min_len_fwd=o.gluon_min_len_fwd,
            min_len_transformed=o.gluon_min_len_transformed,
            tanh=o.tanh,
            dq_reduce=o.gluon_dq_reduce,
            decode=o.decode,
            page_size=o.page_size,
            splits=o.decode_splits,
            varlen=o.varlen,
        ),
    ),
    ("rope-fusion", lambda o: RopeFusionPass(mode=o.rope_mode, sm=o.sm, seq_len=o.seq_len)),
    ("causal-split", lambda o: CausalSplitPass() if o.causal_split else None),
    (
        "tiling",
        lambda o: TilingPass(
            sm=o.sm, block_m=o.block_m, block_n=o.block_n, num_warps=o.num_warps, num_stages=o.num_stages
        ),
    ),
    ("convert-attn-to-tl", lambda o: ConvertAttnToTlPass(sm=o.sm)),
]
"""(stage name, how to build its pass from the pipeline's options, or None to skip it), in order."""
