"""convert-attn-to-tl: lower an annotated attention variant to Triton kernels and a host launcher.

The pass picks, per function, the kernel path that lowers it (`LOWERINGS`, by the function's
direction and kernel-path's `attn.kernel_path`) and replaces the function by that path's
kernels (`tl.kernel`), device functions (`tl.device_fn`) and launcher (`tl.launcher @launch`):

- a forward on the generic kernel (`triton`): `forward_to_tl` (FlashAttention-2's forward,
  `attn_fwd`, with `rotate_k` when K is pre-rotated);
- a forward on the sm90 Gluon kernel (`gluon-sm90`): `gluon_to_tl` (the generic kernels, the
  Gluon kernel's hooks, a launcher that chooses per call);
- a backward function (attn-autodiff's) on the generic kernels: `backward_to_tl` (the
  backward's kernels);
- a backward on the sm90 Gluon kernel: `gluon_bwd_to_tl` (the generic kernels, the Gluon
  backward's hooks and workspace kernels, a launcher that chooses per call);
- a forward compiled for decoding (`decode`): `decode_to_tl` (split-KV over a contiguous or
  paged KV cache, GQA packed, and a combine kernel);
- a forward or backward over packed sequences (`varlen`): `varlen_to_tl` (the generic kernels,
  their programs per sequence);
- a forward in the FP8 form (`fp8`): `fp8_to_tl` (quantization kernels, then the generic
  forward on e4m3 tiles and their scales).

A new kernel path (an sm90 backward, decode, FP8) is a module beside these with a class that
lowers one function (`lower()` -> `launcher_to_tl.LoweredFunction`), and one entry in
`LOWERINGS`. What the paths share: `kernel_lowering` (parameters, score ops, the Q block, the
pre-rotation kernels), `launcher_to_tl` (kernels, launches, allocations), `kv_segments` (the KV
ranges), `qk_transforms_to_tl` and `region_to_tl`, all built with `tl_builder`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.passes.analysis import AttentionChains, analyse, check_sm, target_option, variant_funcs
from attnfuse.passes.backward_to_tl import BackwardLowering
from attnfuse.passes.decode_to_tl import DecodeLowering
from attnfuse.passes.forward_to_tl import ForwardLowering
from attnfuse.passes.fp8_to_tl import Fp8Lowering
from attnfuse.passes.gluon_bwd_to_tl import GluonBackwardLowering
from attnfuse.passes.gluon_to_tl import GluonLowering
from attnfuse.passes.kernel_path import DECODE, FP8, GLUON, TRITON, VARLEN, checked_kernel_path
from attnfuse.passes.launcher_to_tl import LoweredFunction, arg_names
from attnfuse.passes.varlen_to_tl import VarlenBackwardLowering, VarlenLowering

FORWARD = "forward"
BACKWARD = "backward"

PathLowering = Callable[[AttentionChains, list[str]], LoweredFunction]
"""Lowers one function (its analysed chains, the launcher's argument names)."""

LOWERINGS: dict[tuple[str, str], PathLowering] = {
    (FORWARD, TRITON): lambda chains, names: ForwardLowering(chains, names).lower(),
    (FORWARD, GLUON): lambda chains, names: GluonLowering(chains, names).lower(),
    (BACKWARD, TRITON): lambda chains, names: BackwardLowering(chains, names).lower(),
    (BACKWARD, GLUON): lambda chains, names: GluonBackwardLowering(chains, names).lower(),
    (FORWARD, DECODE): lambda chains, names: DecodeLowering(chains, names).lower(),
    (FORWARD, VARLEN): lambda chains, names: VarlenLowering(chains, names).lower(),
    (BACKWARD, VARLEN): lambda chains, names: VarlenBackwardLowering(chains, names).lower(),
    (FORWARD, FP8): lambda chains, names: Fp8Lowering(chains, names).lower(),
}
"""The kernel paths, by (direction, kernel-path's path): where a new path registers."""


@dataclass(frozen=True)
class ConvertAttnToTlPass(ModulePass):
    """Replace each attention function by its Triton kernel(s) (`tl.kernel`) and a host
    launcher (`tl.launcher @launch`) that allocates the outputs and launches them, as the
    function's kernel path (`LOWERINGS`) builds them. The path kernel-path recorded is
    checked first against the function and the target (`kernel_path.checked_kernel_path`)."""

    name = "convert-attn-to-tl"

    sm: int | None = None
    """Target SM version the function's kernel path is checked against; default: the module's
    attn.target, else 90."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        sm = check_sm(target_option(op, "sm", self.sm, 90), self.name)
        funcs = variant_funcs(op)
        if len(funcs) > 1:
            raise DiagnosticException(
                "convert-attn-to-tl lowers one attention function per module, found "
                f"{len(funcs)}: split the input (e.g. --split-input-file)"
            )
        for f in funcs:
            chains = analyse(f)
            direction = BACKWARD if chains.is_backward else FORWARD
            path, _ = checked_kernel_path(chains, sm)
            lower = LOWERINGS.get((direction, path))
            if lower is None:
                raise DiagnosticException(
                    f"func @{f.sym_name.data}: convert-attn-to-tl has no {direction} lowering for kernel path '{path}'"
                )
            lowered = lower(chains, arg_names(f))
            block = f.parent_block()
            assert block is not None
            block.insert_ops_before(lowered.ops, f)
            f.detach()
            f.erase()
