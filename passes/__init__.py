"""AttnFuse's passes (installed as `attnfuse.passes`), one per file named after the pass.

The other modules serve them: `analysis` (the structure of a variant, shared by the
passes), attn-autodiff's `region_grad` (derivatives of score_mod regions), and
convert-attn-to-tl's parts: one module per kernel path (`forward_to_tl`, the generic
forward; `gluon_to_tl`, the sm90 Gluon forward; `backward_to_tl`, the backward, with its
kernels in `backward_pre_to_tl`, `backward_dkdv_to_tl`, `backward_dq_to_tl` and
`backward_epilogues_to_tl`), what the paths share (`kernel_lowering`, `launcher_to_tl`,
`kv_segments`, `qk_transforms_to_tl`, `region_to_tl`) and `tl_builder` (building tl IR).
"""

from collections.abc import Callable

from xdsl.passes import ModulePass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Lazy factories for every AttnFuse pass, keyed by pass name."""

    def attn_autodiff():
        from attnfuse.passes.attn_autodiff import AttnAutodiffPass

        return AttnAutodiffPass

    def kernel_path():
        from attnfuse.passes.kernel_path import KernelPathPass

        return KernelPathPass

    def rope_fusion():
        from attnfuse.passes.rope_fusion import RopeFusionPass

        return RopeFusionPass

    def causal_split():
        from attnfuse.passes.causal_split import CausalSplitPass

        return CausalSplitPass

    def tiling():
        from attnfuse.passes.tiling import TilingPass

        return TilingPass

    def convert_attn_to_tl():
        from attnfuse.passes.convert_attn_to_tl import ConvertAttnToTlPass

        return ConvertAttnToTlPass

    def pipeline():
        from attnfuse.pipeline import AttnFusePipelinePass

        return AttnFusePipelinePass

    return {
        "attn-autodiff": attn_autodiff,
        "kernel-path": kernel_path,
        "rope-fusion": rope_fusion,
        "causal-split": causal_split,
        "tiling": tiling,
        "convert-attn-to-tl": convert_attn_to_tl,
        "attnfuse-pipeline": pipeline,
    }
