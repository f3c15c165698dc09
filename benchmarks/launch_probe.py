"""Host cost of small-N calls on the GPU: the generated launch's direct binary launches
(`_launch`) against Triton's own launch path, and the CUDA-graph floor.

    python benchmarks/launch_probe.py

For causal and RoPE+causal at both shapes and N = 512, 1024, 2048: back-to-back host time
per call (µs; the GPU-bound floor when the kernels take longer), do_bench medians (ms) of the
variant and of its generated launch, the same launch replayed from a CUDA graph (no host
work: the GPU-only floor), and the variant again with a no-op Triton launch hook installed,
which sends every launch through Triton's path (what the generated code did before
`_launch`)."""

import statistics
import sys
import time

import torch
import triton
import triton.testing

sys.path.insert(0, "benchmarks")
import common as C  # noqa: E402

import attnfuse as af  # noqa: E402


def per_call_us(fn, calls=3000, repeats=5):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
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


def main():
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    for shape in C.SHAPES.values():
        for n in (512, 1024, 2048):
            q = torch.randn(shape.batch, shape.q_heads, n, shape.head_dim, device="cuda", dtype=shape.dtype)
            k = torch.randn(shape.batch, shape.kv_heads, n, shape.head_dim, device="cuda", dtype=shape.dtype)
            v = torch.randn_like(k)
            for var in (causal, rope_causal):
                res = measure(var, q, k, v)
                print(
                    f"{shape.name} N={n} {var.__name__}: " + ", ".join(f"{k2} {v2:.4g}" for k2, v2 in res.items()),
                    flush=True,
                )


if __name__ == "__main__":
    main()
