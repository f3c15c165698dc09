"""Compile attn IR to the Python source of its Triton kernels."""

from __future__ import annotations

import hashlib
import io
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.func import FuncOp
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.errors import AttnFuseError
from attnfuse.ir import verify_module
from attnfuse.pipeline import AttnFusePipelinePass
from attnfuse.targets.triton.printer import launch_params, print_triton

DUMP_IR_ENV = "ATTNFUSE_DUMP_IR"
"""The environment variable naming a folder that receives every compilation's IR, stage
by stage (see `compile_module`)."""


@dataclass(frozen=True)
class CompiledSource:
    """The generated module: `source` defines the kernels, `launch(*args) -> (out, lse)`
    and `LAUNCH_PARAMS`; `launch_params` is that table."""

    source: str
    launch_params: dict


class IRDump:
    """Writes one compilation's IR into `folder`, a file per stage, named by the stage
    table (`attnfuse.pipeline.STAGES`): `00-input.mlir`, then `NN-<stage>.mlir` after
    each stage that ran (NN counts the files, so a skipped stage leaves no file and no
    gap), then `NN-triton.py`, the generated source. Files of the same name are
    overwritten."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.written: list[Path] = []

    def module(self, stage: str, module: ModuleOp) -> Path:
        """Write `module` (custom syntax, which reads back) as the IR after `stage`."""
        out = io.StringIO()
        Printer(stream=out).print_op(module)
        out.write("\n")
        return self.text(stage, ".mlir", out.getvalue())

    def text(self, stage: str, suffix: str, text: str) -> Path:
        """Write `text` as the next file, `NN-<stage><suffix>`."""
        path = self.folder / f"{len(self.written):02d}-{stage}{suffix}"
        path.write_text(text)
        self.written.append(path)
        return path


def compile_module(
    module: ModuleOp,
    *,
    sm: int | None = None,
    seq_len: int | None = None,
    dump_ir: str | os.PathLike[str] | None = None,
    direction: str = "fwd",
    wrt: tuple[int, ...] = (),
    **options,
) -> CompiledSource:
    """Lower a module holding one attention function (it is not modified) to Triton source:
    its forward, or with `direction="bwd"` its backward (attn-autodiff first) for the
    gradients of the arguments `wrt` (indices; empty: all that have one), whose
    `launch(*args, out, lse, dout)` returns them in that order.
    `options` are the pipeline's (gluon, gluon_head_dims, gluon_min_len,
    gluon_min_len_transformed, tanh, rope_mode, block_m, block_n, num_warps, num_stages,
    causal_split); another name is an `AttnFuseError` that lists them, a bad value the stage's
    `ValueError` naming the option. The module is verified first, dominance included; invalid
    IR raises `AttnFuseError`.

    Per-stage IR dump: with `dump_ir=<folder>`, or with the environment variable
    `ATTNFUSE_DUMP_IR=<folder>`, every stage's IR is written as it is produced (so a
    failing stage still leaves the stages before it): `00-input.mlir`,
    `01-kernel-path.mlir`, `02-rope-fusion.mlir`, `03-causal-split.mlir`, `04-tiling.mlir`,
    `05-convert-attn-to-tl.mlir`, `06-triton.py` (names from `attnfuse.pipeline.STAGES`,
    numbered in the order written; see `IRDump`). `dump_ir` names the folder itself;
    the environment variable names a parent folder, in which each compilation gets its
    own `<function>-<hash of IR and options>` folder. The runtime compiles only on a
    kernel cache miss, so to dump a kernel it has cached, point `ATTNFUSE_CACHE_DIR` at
    an empty folder too. `attnfuse-opt --dump-stages DIR` writes the same files."""
    try:
        verify_module(module)
    except DiagnosticException as e:
        raise AttnFuseError(f"invalid attn IR:\n{e}") from e
    if direction not in ("fwd", "bwd"):
        raise AttnFuseError(f"compile_module direction must be 'fwd' or 'bwd', got {direction!r}")
    known = {f.name for f in fields(AttnFusePipelinePass)} - {"sm", "seq_len", "backward", "wrt"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise AttnFuseError(f"compile_module got unknown pipeline options {unknown}; it takes {sorted(known)}")
    if direction == "bwd":
        options = {**options, "backward": True, "wrt": tuple(wrt)}
    module = module.clone()
    pipeline = AttnFusePipelinePass(sm=sm, seq_len=seq_len, **options)
    dump = _ir_dump(module, dump_ir, sm=sm, seq_len=seq_len, options=options)
    if dump is None:
        pipeline.apply(Context(), module)
    else:
        dump.module("input", module)
        pipeline.apply(Context(), module, after=dump.module)
    out = io.StringIO()
    print_triton(module, out)
    source = out.getvalue()
    if dump is not None:
        dump.text("triton", ".py", source)
    return CompiledSource(source, launch_params(module))


def _ir_dump(
    module: ModuleOp, dump_ir: str | os.PathLike[str] | None, *, sm: int | None, seq_len: int | None, options: dict
) -> IRDump | None:
    """The dump for one compilation: into `dump_ir`, else into a folder of its own under
    `$ATTNFUSE_DUMP_IR`, else none."""
    if dump_ir is not None:
        return IRDump(dump_ir)
    if not (root := os.environ.get(DUMP_IR_ENV)):
        return None
    text = f"{module}\n{sm=} {seq_len=} {sorted(options.items())}"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    name = next((op.sym_name.data for op in module.ops if isinstance(op, FuncOp)), "module")
    return IRDump(Path(root) / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{digest}")
