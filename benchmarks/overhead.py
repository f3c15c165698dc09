"""Per-call cost of the runtime's cache-hit path.

    python benchmarks/overhead.py                 # CPU: a trivial launch stub
    python benchmarks/overhead.py --device cuda   # GPU: the real kernel, tiny N

On the CPU the generated module is replaced by one whose `launch` returns at once, so
the difference to calling that stub directly is the runtime's own cost: signature
tuple, dict lookup, relation checks, call. On the GPU the same difference is taken
around the real Triton launch (the generated `launch` called directly vs the variant).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace

TRIVIAL = """
def launch(q, k, v, *extras, lse=None):
    return q, None
"""


def trivial_compile(module, *, sm=None, seq_len=None):
    """A compile_module stand-in whose generated launch does nothing."""
    return SimpleNamespace(source=TRIVIAL, launch_params={})


def per_call_us(fn: Callable[[], object], calls: int, repeats: int, sync: Callable[[], None]) -> float:
    """Median over `repeats` of the mean time of `calls` back-to-back calls, in µs."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.device == "cpu":
        # The stub is loaded as an interpreted kernel; with Triton's library interpreted
        # from the start (set before triton is imported), nothing wraps its launch.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("ATTNFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="attnfuse-overhead-"))

    import torch

    import attnfuse as af
    from attnfuse import cache

    @af.variant
    def rope_causal(q, k, v):
        q = af.rope(q, theta=500000.0)
        k = af.rope(k, theta=500000.0)
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    @af.variant
    def documents(q, k, v, ids):
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal & af.document(ids))), v)

    dev = torch.device(args.device)
    q = torch.randn(1, 8, 16, 64, device=dev, dtype=torch.float16)
    k = torch.randn(1, 2, 16, 64, device=dev, dtype=torch.float16)
    v = torch.randn(1, 2, 16, 64, device=dev, dtype=torch.float16)
    ids = torch.zeros(1, 16, device=dev, dtype=torch.int32)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    name = f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, device {dev}{name}")

    backend, compiler = ("interpret", trivial_compile) if dev.type == "cpu" else ("triton", None)
    with af.backend(backend), cache.use_compiler(compiler):
        launch = rope_causal.compile(q, k, v).launch
        doc_launch = documents.compile(q, k, v, ids).launch
        rows = [
            ("generated launch, rope_causal", lambda: launch(q, k, v)),
            ("rope_causal(q, k, v)", lambda: rope_causal(q, k, v)),
            ("generated launch, documents", lambda: doc_launch(q, k, v, ids)),
            ("documents(q, k, v, ids)", lambda: documents(q, k, v, ids)),
        ]
        results = [(label, per_call_us(fn, args.calls, args.repeats, sync)) for label, fn in rows]
    width = max(len(label) for label, _ in results)
    for label, us in results:
        print(f"{label:<{width}}  {us:8.2f} µs/call")
    plain = results[1][1] - results[0][1]
    extra = results[3][1] - results[2][1]
    print(f"runtime overhead per call (cache hit): {plain:.2f} µs, with one extra tensor {extra:.2f} µs")


if __name__ == "__main__":
    main()
