"""The child process of test_runtime.py's multi-process cache tests (started with
multiprocessing's `spawn`, so it imports this module afresh): one call of a RoPE + causal
variant on the interpret backend through the disk cache, with a stand-in compiler."""

from __future__ import annotations

import functools
import os
import traceback
from typing import Any

import stub_compiler
import torch

import attnfuse as af
from attnfuse import cache
from attnfuse.reference import run_reference


@af.variant
def rope_causal(q, k, v):
    q = af.rope(q, theta=10000.0)
    k = af.rope(k, theta=10000.0)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


COMPILERS = {
    # slow enough that processes which do not wait for each other would all compile
    "reference": functools.partial(stub_compiler.reference_compile, delay=0.5),
    "failing": stub_compiler.failing_compile,
}


def call(mode: str, cache_dir: str, barrier: Any, results: Any) -> None:
    """Wait for the other children at `barrier`, make the call compiling with COMPILERS[mode],
    and put (pid, runtime stats, max error against the reference) on `results`, or (pid,
    None, the traceback) if anything failed."""
    try:
        results.put(_call(mode, cache_dir, barrier))
    except BaseException:
        results.put((os.getpid(), None, traceback.format_exc()))


def _call(mode: str, cache_dir: str, barrier: Any) -> tuple[int, dict[str, int], float]:
    os.environ["ATTNFUSE_CACHE_DIR"] = cache_dir
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 12, 16, generator=g)
    k, v = torch.randn(1, 2, 20, 16, generator=g), torch.randn(1, 2, 20, 16, generator=g)
    rope_causal.ir(q, k, v), cache.triton_version(), cache.version_fingerprint()  # the slow parts, before
    barrier.wait(timeout=120)
    with af.backend("interpret"), cache.use_compiler(COMPILERS[mode]):
        out = rope_causal(q, k, v)
    err = (out.double() - run_reference(rope_causal.ir_module(), q, k, v)).abs().max().item()
    return os.getpid(), af.runtime.stats(), err
