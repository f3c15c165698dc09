"""The xDSL plugin entry point: makes `xdsl-opt` and `attnfuse-opt` see AttnFuse."""

from xdsl.universe import Universe

from attnfuse.dialects import get_all_dialects
from attnfuse.passes import get_all_passes
from attnfuse.targets import get_all_targets

ATTNFUSE_UNIVERSE = Universe(
    all_dialects=get_all_dialects(),
    all_passes=get_all_passes(),
    all_targets=get_all_targets(),
)
