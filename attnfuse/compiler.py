"""Compile attn IR to the Python source of its Triton kernels."""

from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
from collections.abc import Callable
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
    overwritten.

    A folder or file that cannot be written is an `AttnFuseError` naming it; with
    `variable` (the environment variable that asked for the dump, `ATTNFUSE_DUMP_IR`) it is
    instead one warning per process and folder, naming the variable, and the compilation
    goes on undumped: the dump is a debugging aid and must not break every compilation."""

    def __init__(self, folder: str | os.PathLike[str], *, variable: str | None = None):
        self.folder = Path(folder)
        self.variable = variable
        self.written: list[Path] = []
        self.failed = False
        self._write(self.folder, lambda: self.folder.mkdir(parents=True, exist_ok=True))

    def module(self, stage: str, module: ModuleOp) -> Path | None:
        """Write `module` (custom syntax, which reads back) as the IR after `stage`."""
        out = io.StringIO()
        Printer(stream=out).print_op(module)
        out.write("\n")
        return self.text(stage, ".mlir", out.getvalue())

    def text(self, stage: str, suffix: str, text: str) -> Path | None:
        """Write `text` as the next file, `NN-<stage><suffix>`; its path, or None when the
        dump has failed (under a variable: see the class)."""
        if self.failed:
            return None
        path = self.folder / f"{len(self.written):02d}-{stage}{suffix}"
        if not self._write(path, lambda: path.write_text(text)):
            return None
        self.written.append(path)
        return path

    def _write(self, path: Path, write: Callable[[], object]) -> bool:
        """Run `write` (which writes `path`); False after a failure the dump survives."""
        try:
            write()
            return True
        except OSError as e:
            self.failed = True
            if self.variable is None:
                raise AttnFuseError(f"cannot write the IR dump {path}: {e}") from e
            parent = self.folder.parent
            if parent not in _unwritable_dumps:
                _unwritable_dumps.add(parent)
                warnings.warn(
                    f"{self.variable}={os.environ.get(self.variable, '')!r}: cannot write the IR dump {path} ({e}); "
                    f"compilations go on without dumping there. Point {self.variable} at a writable folder.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return False


_unwritable_dumps: set[Path] = set()
"""The `ATTNFUSE_DUMP_IR` folders already warned about (one warning each per process)."""


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
    `launch(*args, out, lse, dout)` returns them in that order, or with `direction="decode"`
    its decode kernels (`launch(q, k_cache, v_cache, *extras, cache_seqlens[, page_table])`;
    option `page_size` for a paged cache). Option `varlen=True` compiles the forward or backward
    over packed sequences (q, k, v as [1, H, total, D]; the forward's `launch` takes
    `cu_seqlens_q, cu_seqlens_k, max_seqlen_q` after the function's arguments, the backward's
    also `max_seqlen_k, positions_q, positions_k`).
    `options` are the pipeline's (gluon, gluon_head_dims, gluon_min_len, gluon_min_len_fwd,
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
    own `<function>-<hash of IR and options>` folder (`~` and `$VARIABLES` expanded). A
    folder that cannot be written is an `AttnFuseError` for `dump_ir`, one warning naming
    the variable for `ATTNFUSE_DUMP_IR` (the compilation goes on undumped; see `IRDump`).
    The runtime compiles on a kernel cache miss; while the variable is set, a kernel it
    loads from the disk cache is compiled once more for its dump (`attnfuse.cache`), and
    the reference backend, which compiles nothing, warns once that it dumps nothing.
    `attnfuse-opt --dump-stages DIR` writes the same files."""
    try:
        verify_module(module)
    except DiagnosticException as e:
        raise AttnFuseError(f"invalid attn IR:\n{e}") from e
    if direction not in ("fwd", "bwd", "decode", "varlen"):
        raise AttnFuseError(f"compile_module direction must be 'fwd', 'bwd', 'decode' or 'varlen', got {direction!r}")
    if wrt and direction != "bwd":
        raise AttnFuseError(f"compile_module wrt={tuple(wrt)} needs direction='bwd' (a forward has no gradients)")
    known = {f.name for f in fields(AttnFusePipelinePass)} - {"sm", "seq_len", "backward", "wrt"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise AttnFuseError(f"compile_module got unknown pipeline options {unknown}; it takes {sorted(known)}")
    if direction == "bwd":
        options = {**options, "backward": True, "wrt": tuple(wrt)}
    elif direction == "decode":
        options = {**options, "decode": True}
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
    `$ATTNFUSE_DUMP_IR` (`~` and `$VARIABLES` expanded), else none."""
    if dump_ir is not None:
        return IRDump(dump_ir)
    if not (root := os.environ.get(DUMP_IR_ENV)):
        return None
    text = f"{module}\n{sm=} {seq_len=} {sorted(options.items())}"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    name = next((op.sym_name.data for op in module.ops if isinstance(op, FuncOp)), "module")
    folder = Path(os.path.expanduser(os.path.expandvars(root)))
    return IRDump(folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{digest}", variable=DUMP_IR_ENV)
