"""AttnFuse's passes (installed as `attnfuse.passes`), one per file named after the pass."""

from collections.abc import Callable

from xdsl.passes import ModulePass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Lazy factories for every AttnFuse pass, keyed by pass name."""
    return {}
