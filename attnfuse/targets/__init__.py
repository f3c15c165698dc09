"""Code generation targets (`attnfuse-opt -t <target>`), a folder each, as xDSL keeps
`backend/<target>/`: the printer and its `Target` class in one module, plus whatever the
generated code needs. (The folder is `targets`, not `backend`: `af.backend(...)` is the
runtime's backend selector, and a subpackage of that name would shadow it.)

- `triton/`: `@triton.jit` kernels and their host launcher, for CUDA GPUs and the Triton
  interpreter (`printer.py`; `prelude.py`, the runtime support every generated module
  carries). Its FileCheck tests are in `lit_tests/targets/triton/`.
"""

from collections.abc import Callable

from xdsl.utils.target import Target


def get_all_targets() -> dict[str, Callable[[], type[Target]]]:
    """Lazy factories for every AttnFuse target, keyed by target name."""

    def get_triton() -> type[Target]:
        from attnfuse.targets.triton.printer import TritonTarget

        return TritonTarget

    return {"triton": get_triton}
