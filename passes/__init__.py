"""AttnFuse's passes (installed as `attnfuse.passes`), one per file named after the pass.

The other modules serve them: `analysis` (the structure of a variant, shared by the
passes), attn-autodiff's `region_grad` (derivatives of score_mod regions), and
convert-attn-to-tl's parts: `tl_builder` (building tl IR), `qk_transforms_to_tl`,
`region_to_tl`, `kv_segments` and `backward_to_tl` (the backward's kernels).
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
