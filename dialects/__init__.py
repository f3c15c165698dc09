"""AttnFuse's IR levels (installed as `attnfuse.dialects`)."""

from collections.abc import Callable

from xdsl.ir import Dialect


def get_all_dialects() -> dict[str, Callable[[], Dialect]]:
    """Lazy factories for every AttnFuse dialect, keyed by dialect name."""

    def get_attn() -> Dialect:
        from attnfuse.dialects.attn import Attn

        return Attn

    def get_tl() -> Dialect:
        from attnfuse.dialects.tl import TL

        return TL

    return {"attn": get_attn, "tl": get_tl}
