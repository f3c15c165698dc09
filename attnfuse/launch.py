"""Launch targets: where a variant call runs. The backend in effect, the device's SM,
the kernels loaded through the kernel cache and the wrappers that launch them, and the
reference backend's compute dtype. The front end (`attnfuse.runtime`) and the custom-op
targets (`attnfuse.autograd`) both use this module, which uses neither: a call reads
runtime -> autograd -> launch.

Backends:

- `triton`: the generated Triton kernel on CUDA tensors;
- `interpret`: the same generated code under the Triton interpreter (on CPU). bfloat16
  calls run the float32 kernel (inputs cast up, the output back down): Triton 3.6's
  interpreter multiplies bfloat16 bit patterns in `tl.dot`. A call large enough to take
  long there warns once per process (`SlowInterpreterWarning`) with the expected time;
- `reference`: the eager PyTorch executor of the attn IR (`attnfuse.reference`),
  computing in float32 (float64 for float64 tensors, which only this backend runs, so
  `torch.autograd.gradcheck` works there) and returning q's dtype;
- `auto` (the default): `triton` for CUDA tensors, `reference` for CPU tensors.

The backend comes from `with af.backend(name):` (per thread and task: a context
variable), else from the `ATTNFUSE_BACKEND` environment variable, else `auto`.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from xdsl.utils.exceptions import DiagnosticException

from attnfuse import dsl
from attnfuse.cache import KERNELS, KernelSpec, LoadedKernel, seq_bucket
from attnfuse.errors import AttnFuseError

__all__ = [
    "BACKENDS",
    "SlowInterpreterWarning",
    "backend",
    "current_backend",
    "device_sm",
    "kernel_mode",
    "load_kernel",
    "reference_dtype",
]

BACKENDS = ("auto", "triton", "interpret", "reference")

backend_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("attnfuse_backend", default=None)


def check_backend(name: object, source: str) -> str:
    if name not in BACKENDS:
        raise AttnFuseError(f"{source} {name!r} is not a backend; expected one of {', '.join(BACKENDS)}")
    return name  # type: ignore[return-value]


@contextlib.contextmanager
def backend(name: str) -> Iterator[None]:
    """Run variants inside the block on backend `name` (auto, triton, interpret or
    reference)."""
    token = backend_var.set(check_backend(name, "af.backend"))
    try:
        yield
    finally:
        backend_var.reset(token)


# os.environ.get costs about a microsecond (the key is encoded on every call); the hot path
# reads the variable from os.environ's own mapping with the key encoded once, so changes made
# through os.environ (and pytest's monkeypatch) are still seen.
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("ATTNFUSE_BACKEND") if hasattr(os.environ, "encodekey") else None  # type: ignore[attr-defined]


def env_backend() -> str | None:
    """$ATTNFUSE_BACKEND, or None when unset."""
    if _ENV_DATA is None or _ENV_KEY is None:
        return os.environ.get("ATTNFUSE_BACKEND")
    raw = _ENV_DATA.get(_ENV_KEY)
    return None if raw is None else os.environ.decodevalue(raw)  # type: ignore[attr-defined]


def current_backend() -> str:
    """The backend name in effect: af.backend(...), else $ATTNFUSE_BACKEND, else auto."""
    name = backend_var.get()
    if name is not None:
        return name
    env = os.environ.get("ATTNFUSE_BACKEND")
    return check_backend(env, "ATTNFUSE_BACKEND=") if env else "auto"


# --------------------------------------------------------------------------- kernels

_SM: dict[int, int] = {}


def device_sm(device: torch.device | str | int | None = None) -> int:
    """The SM version of a CUDA device (its compute capability as major * 10 + minor: 90
    for Hopper), the current one by default; 0 for a device that is not a CUDA GPU, or
    without CUDA (the interpreter's SM). Cached per device."""
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _SM:
        major, minor = torch.cuda.get_device_capability(index)
        _SM[index] = major * 10 + minor
    return _SM[index]


def kernel_mode(backend_name: str, q: torch.Tensor) -> str:
    """The backend that runs for `backend_name` and these tensors."""
    if backend_name == "auto":
        return "triton" if q.device.type == "cuda" else "reference"
    if backend_name == "triton" and q.device.type != "cuda":
        raise AttnFuseError(
            f"backend 'triton' runs on CUDA tensors, but q is on {q.device}; use 'interpret' or "
            f"'reference' for CPU tensors"
        )
    return backend_name


def load_kernel(
    trace: dsl.Trace,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    interpret: bool,
    *,
    direction: str = "fwd",
    page_size: int = 0,
    varlen: bool = False,
) -> tuple[LoadedKernel, Callable[..., Any], KernelSpec]:
    """The kernel of `trace` for these tensors, its launch function (`KernelCache.launcher`)
    and its spec: the forward, or with `direction="decode"` the decode kernels (`page_size`:
    0 for a contiguous cache); `varlen`: over packed sequences."""
    spec = KernelSpec(
        ir=trace.text,
        dtypes=(str(q.dtype), str(k.dtype), str(v.dtype)),
        heads=(q.shape[1], k.shape[1]),
        head_dims=(q.shape[3], v.shape[3]),
        seq_bucket=seq_bucket(q.shape[2], k.shape[2]),
        sm=0 if interpret else device_sm(q.device),
        interpret=interpret,
        direction=direction,
        page_size=page_size,
        varlen=varlen,
    )
    try:
        return (*KERNELS.launcher(trace.module, spec), spec)
    except DiagnosticException as e:
        name = trace.module.ops.first.sym_name.data  # type: ignore[union-attr]
        raise AttnFuseError(
            f"the Triton lowering cannot compile {name}: {e} (the reference backend runs every variant the attn "
            f"dialect can express)"
        ) from e


def as_float32(x: object) -> object:
    """A bfloat16 tensor as a float32 copy; anything else as it is."""
    if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16:
        return x.float()
    return x


def via_float32(launch: Callable[..., Any]) -> Callable[..., Any]:
    """`launch` of a float32 kernel, called with the tensors of a bfloat16 call: they are
    cast to float32, the output back to bfloat16 (lse stays float32)."""

    def run(*tensors: torch.Tensor, lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse_out = launch(*[as_float32(t) for t in tensors], lse=lse)
        return out.to(torch.bfloat16), lse_out

    return run


LSE_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def lse_workspace(q: torch.Tensor) -> torch.Tensor:
    """A float32 buffer on q's device with room for a call's log-sum-exp ([B, Hq, Nq]), for
    calls that discard it (no backward): the kernel writes it there instead of into a new
    allocation (a few microseconds of host time per call). One per device, grown as needed
    and kept; concurrent calls may share it, since nothing reads it."""
    b, h, n, _ = q.shape
    n *= b * h
    ws = LSE_WORKSPACES.get(q.device)
    if ws is None or ws.numel() < n:
        from attnfuse.targets.triton.prelude import _kept  # kept: outside CUDA-graph pools

        size = max(n, 1 << 16)
        ws = _kept(lambda: torch.empty(size, dtype=torch.float32, device=q.device), q.device)
        LSE_WORKSPACES[q.device] = ws
    return ws


def reference_dtype(q: torch.Tensor) -> torch.dtype:
    """The reference backend's compute dtype for a call of q: float64 for float64 calls,
    else float32 (the kernels' accumulation type)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- slow interpreter runs


class SlowInterpreterWarning(UserWarning):
    """An interpret-backend call large enough to take long (warned once per process)."""


INTERPRET_SECONDS_PER_SCORE = 2.5e-5
"""The interpreter's time per score of a forward, B * Hq * Nq * Nk (about 2e-5 s on a
2-core CPU, measured for causal and full attention at N 64 to 256, head dims 32 and 64;
the head dim barely matters: numpy multiplies a tile's channels at once)."""

SLOW_INTERPRET_SECONDS = 10.0
"""The expected forward time from which an interpret-backend call warns."""

_slow_warned = False


def warn_if_slow(q: torch.Tensor, k: torch.Tensor) -> None:
    """Warn once per process (`SlowInterpreterWarning`) when the interpreter's forward of
    q and k is expected to take `SLOW_INTERPRET_SECONDS` or more, giving that time."""
    global _slow_warned
    if _slow_warned:
        return
    b, h, nq, _ = q.shape
    seconds = b * h * nq * k.shape[2] * INTERPRET_SECONDS_PER_SCORE
    if seconds >= SLOW_INTERPRET_SECONDS:
        _slow_warned = True
        warnings.warn(
            f"the interpret backend runs the generated kernel in Python: this call (B {b}, {h} heads, Nq {nq}, "
            f"Nk {k.shape[2]}) is expected to take about {seconds:.0f} s forward, 2-3 times that backward. "
            f"The reference backend (af.backend('reference')) runs it eagerly in PyTorch; smaller shapes run "
            f"faster here (this warning is shown once per process)",
            SlowInterpreterWarning,
            stacklevel=4,  # warn_if_slow, the entry's run, Variant.__call__, the caller
        )
