"""Compile attn IR to the Python source of its Triton kernels."""

from __future__ import annotations

import io
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from attnfuse.pipeline import AttnFusePipelinePass
from attnfuse.targets.triton.printer import launch_params, print_triton


@dataclass(frozen=True)
class CompiledSource:
    """The generated module: `source` defines the kernels, `launch(*args) -> (out, lse)`
    and `LAUNCH_PARAMS`; `launch_params` is that table."""

    source: str
    launch_params: dict


def compile_module(module: ModuleOp, *, sm: int | None = None, seq_len: int | None = None, **options) -> CompiledSource:
    """Lower a module holding one attention function (it is not modified) to Triton source.
    `options` are the pipeline's (rope_mode, block_m, block_n, num_warps, num_stages,
    causal_split)."""
    module = module.clone()
    AttnFusePipelinePass(sm=sm, seq_len=seq_len, **options).apply(Context(), module)
    out = io.StringIO()
    print_triton(module, out)
    return CompiledSource(out.getvalue(), launch_params(module))
