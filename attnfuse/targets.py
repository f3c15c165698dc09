"""Output targets of `attnfuse-opt -t ...`."""

from collections.abc import Callable

from xdsl.utils.target import Target


def get_all_targets() -> dict[str, Callable[[], type[Target]]]:
    """Lazy factories for every AttnFuse target, keyed by target name."""
    return {}
