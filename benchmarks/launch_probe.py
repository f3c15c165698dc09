"""Host cost of small-N calls on the GPU: the generated launch's direct binary launches
(`_launch`) against Triton's own launch path, and the CUDA-graph floor.

    python benchmarks/launch_probe.py
    python benchmarks/launch_probe.py --cpu-smoke   # no GPU: tiny shapes, the interpreter


For causal and RoPE+causal at both shapes and N = 512, 1024, 2048: back-to-back host time
per call (µs; the GPU-bound floor when the kernels take longer), do_bench medians (ms) of the
variant and of its generated launch, the same launch replayed from a CUDA graph (no host
work: the GPU-only floor), and the variant again with a no-op Triton launch hook installed,
which sends every launch through Triton's path (what the generated code did before
`_launch`)."""

import argparse
import statistics
import sys
import time

import torch
import triton
import triton.testing

sys.path.insert(0, "benchmarks")
import common as C  # noqa: E402

import attnfuse as af  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_us(fn, calls=3000, repeats=5):
    fn()
    _sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync()
        ts.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(ts)


def gpu_ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_ms(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return gpu_ms(g.replay)


@af.variant
def rope_causal(q, k, v):
    q = af.rope(q, theta=10000.0)
    k = af.rope(k, theta=10000.0)
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


@af.variant
def causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def _no_op_hook(*args):
    return None


def measure(var, q, k, v) -> dict[str, float]:
    launch = var.compile(q, k, v).launch
    res = {
        "variant call us": per_call_us(lambda: var(q, k, v)),
        "launch() us": per_call_us(lambda: launch(q, k, v)),
        "3x torch.empty us": per_call_us(
            lambda: (torch.empty_like(q), torch.empty_like(k), torch.empty(q.shape[:3], device=q.device))
        ),
        "do_bench variant ms": gpu_ms(lambda: var(q, k, v)),
        "do_bench launch ms": gpu_ms(lambda: launch(q, k, v)),
        "cuda graph launch ms": graph_ms(lambda: launch(q, k, v)),
    }
    triton.knobs.runtime.launch_enter_hook.add(_no_op_hook)
    try:
        res["JIT path: variant call us"] = per_call_us(lambda: var(q, k, v))
        res["JIT path: do_bench variant ms"] = gpu_ms(lambda: var(q, k, v))
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(_no_op_hook)
    return res


def smoke(var, q, k, v) -> dict[str, float]:
    """--cpu-smoke: the variant under the interpreter, checked against the reference, and
    the host time of its cache-hit call (no GPU timings)."""
    with af.backend("interpret"):
        out = var(q, k, v)
        with af.backend("reference"):
            ref = var(q, k, v)
        torch.testing.assert_close(out.float(), ref.float(), atol=C.ATOL, rtol=C.RTOL)
        return {"variant call us": per_call_us(lambda: var(q, k, v), calls=3, repeats=1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="no GPU: tiny shapes, generated kernels under the Triton interpreter"
    )
    args = ap.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.exit("launch_probe.py measures GPU launches and needs CUDA; use --cpu-smoke without a GPU")
    device = "cpu" if args.cpu_smoke else "cuda"
    shapes, ns = (C.SMOKE_SHAPES, (16, 40)) if args.cpu_smoke else (C.SHAPES, (512, 1024, 2048))
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name() if device == "cuda" else "cpu")
    for shape in (shapes[s] for s in C.DEFAULT_SHAPES):
        for n in ns:
            q = torch.randn(shape.batch, shape.q_heads, n, shape.head_dim, device=device, dtype=shape.dtype)
            k = torch.randn(shape.batch, shape.kv_heads, n, shape.head_dim, device=device, dtype=shape.dtype)
            v = torch.randn_like(k)
            for var in (causal, rope_causal):
                res = smoke(var, q, k, v) if args.cpu_smoke else measure(var, q, k, v)
                print(
                    f"{shape.name} N={n} {var.__name__}: " + ", ".join(f"{k2} {v2:.4g}" for k2, v2 in res.items()),
                    flush=True,
                )


if __name__ == "__main__":
    main()
