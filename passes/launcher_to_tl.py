"""What every kernel path of convert-attn-to-tl shares on the host side: the built kernels
and how the launcher runs them (`KernelCall`), a lowered function's ops (`LoweredFunction`),
the launcher's argument names and its allocations and launches.

A kernel path (`forward_to_tl`, `gluon_to_tl`, `backward_to_tl`) builds its kernels with
`tl_builder`, wraps each body in a `tl.kernel` (`kernel_op`) and launches them in order from
one `tl.launcher @launch` (`call_op`, `alloc_like`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.ir import Attribute, Block

from attnfuse.dialects import tl
from attnfuse.dialects.tl import RESERVED_NAMES, dtype_name
from attnfuse.passes.tl_builder import Params

HOST_NAMES = ("out", "lse", "k_rot", "q_rot", "dout", "delta", "dq", "dk", "dv", "dsink_part")
HOST_NAMES += tuple(f"{x}{suffix}" for x in "qkv" for suffix in ("8", "_scale", "_amax", "_amax_all"))
"""Names the launchers give their own tensors (a variant argument named so is renamed)."""


@dataclass
class KernelCall:
    """A built kernel and how the launcher runs it."""

    kernel: tl.KernelOp
    params: Params
    grid: list[str]
    """Host expressions for the grid's axes."""
    num_warps: int
    num_stages: int


@dataclass
class LoweredFunction:
    """What a kernel path makes of one attention function: its kernels and device functions
    (in the order the module defines them) and the launcher that runs them."""

    kernels: list[tl.KernelOp]
    launcher: tl.LauncherOp
    functions: list[tl.DeviceFnOp] = field(default_factory=list)
    """`tl.device_fn`s a kernel calls (the Gluon kernel's hooks), after the kernels."""

    @property
    def ops(self) -> list[tl.KernelOp | tl.DeviceFnOp | tl.LauncherOp]:
        """The module-level ops that replace the function, in order."""
        return [*self.kernels, *self.functions, self.launcher]


def erase_dead(block: Block) -> None:
    """Drop values the lowering built but no op uses (e.g. masks only some variants need)."""
    for op in reversed(list(block.ops)):
        for region in op.regions:
            for inner in region.blocks:
                erase_dead(inner)
        if op.results and not isinstance(op, tl.ForOp) and all(not r.uses for r in op.results):
            block.erase_op(op)


def device_fn_op(name: str, p: Params) -> tl.DeviceFnOp:
    """A `tl.device_fn` holding the built body, its unused values dropped (the functions the
    sm90 Gluon kernels call)."""
    erase_dead(p.block)
    return tl.DeviceFnOp(name, p.block)


def kernel_op(name: str, p: Params) -> tl.KernelOp:
    """A `tl.kernel` holding the built body (with the arguments it created)."""
    arg_types = [a.type for a in p.block.args]
    kernel = tl.KernelOp(name, arg_types, [a.name_hint or f"a{i}" for i, a in enumerate(p.block.args)], p.constexprs)
    old = kernel.body.block
    kernel.body.detach_block(old)
    kernel.body.add_block(p.block)
    erase_dead(p.block)
    return kernel


def call_op(c: KernelCall) -> tl.CallOp:
    """The launcher's launch of a built kernel."""
    return tl.CallOp(c.kernel.sym_name.data, c.grid, c.params.host, c.num_warps, c.num_stages)


def alloc_like(var: str, like: str, heads: int, dim: int, dtype: Attribute, ordered: bool = False) -> tl.AllocOp:
    """`var = torch.empty` of [B, heads, N, dim] in `dtype`, B and N (and the device) those
    of the launcher's tensor `like`; `ordered`: laid out in like's dimension order (`order_of`)."""
    return tl.AllocOp(
        var,
        [f"{like}.shape[0]", str(heads), f"{like}.shape[2]", str(dim)],
        dtype_name(dtype, "torch"),
        f"{like}.device",
        order_of=like if ordered else None,
    )


def arg_names(f: func.FuncOp) -> list[str]:
    """Python parameter names of the launcher: the function's argument names."""
    names: list[str] = []
    for i, a in enumerate(f.body.block.args):
        n = a.name_hint if a.name_hint and a.name_hint.isidentifier() else f"arg{i}"
        reserved = n in RESERVED_NAMES or n in HOST_NAMES
        if n in names or reserved or n.startswith(("inv_freq", "rope_", "_", "grad_")):
            n = f"{n}_{i}"
        names.append(n)
    return names
