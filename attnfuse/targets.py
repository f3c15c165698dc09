"""Output targets of `attnfuse-opt -t ...`."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target


@dataclass(frozen=True)
class TritonTarget(Target):
    """Readable Python: the `@triton.jit` kernels, the host `launch` function and the
    launch parameters (grid, num_warps, num_stages, constexprs) of a `tl` module."""

    name = "triton"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        from attnfuse.triton_printer import print_triton

        print_triton(module, output)


def get_all_targets() -> dict[str, Callable[[], type[Target]]]:
    """Lazy factories for every AttnFuse target, keyed by target name."""
    return {"triton": lambda: TritonTarget}
