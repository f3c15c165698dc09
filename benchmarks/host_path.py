"""Host time of a cache-hit call at small N (issue 13's target: <= 20 µs at N = 128), against
SDPA's, on the GPU, in one process.

    python benchmarks/host_path.py [--out DIR] [--ns 128,512]

Llama-3-8B's attention shape (B=1, Hq=32, Hkv=8, D=128, bf16). For plain causal and RoPE+causal
(Llama 3's RoPE) it measures, back to back, the host time per call (µs: calls are issued
faster than the GPU runs them only when the kernels take less than that):

- the variant call (what users run), with and without an input requiring grad under no_grad;
- the generated `launch()` called directly (no runtime), allocating its own lse;
- SDPA with `enable_gqa=True` (PyTorch's own choice of backend), cuDNN and flash on K/V
  expanded to 32 heads (expanded once, outside the timing);
- one `torch.empty` of the output's size (what an allocation costs on this host);
- the same call replayed from a CUDA graph (the GPU-only floor), which also checks that the
  call captures;

then a cProfile of 2000 variant calls (the top functions by own time), to show where the
remaining host time goes. Results: `host_path.md` and `host_path.json` in --out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

import attnfuse as af  # noqa: E402
from attnfuse import variants  # noqa: E402


@af.variant
def causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def per_call_us(fn, calls: int = 3000, repeats: int = 7) -> float:
    """Median over `repeats` of the mean host time of `calls` back-to-back calls (µs),
    including the final synchronisation."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def graph_us(fn) -> float:
    """Per-call time of `fn` replayed from a CUDA graph of 100 calls (µs): the GPU-only floor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(100):
            fn()
    return per_call_us(graph.replay, calls=50, repeats=5) / 100


def profile_top(fn, calls: int = 2000, top: int = 14) -> str:
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("host_path_results"))
    ap.add_argument("--ns", default="128,512")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("host_path.py measures GPU calls and needs CUDA")
    args.out.mkdir(parents=True, exist_ok=True)
    env = C.environment()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows: list[dict] = []
    profiles: list[str] = []
    for n in [int(x) for x in args.ns.split(",")]:
        measure(n, rows, profiles)
    table = ["| N | call | host µs per call |", "|---|---|---|"]
    table += [f"| {r['n']} | {r['call']} | {r['host_us']} |" for r in rows]
    (args.out / "host_path.md").write_text(
        "# Host time per call\n\n" + C.env_markdown(env) + "\n\n" + "\n".join(table) + "\n\n" + "\n".join(profiles)
    )
    (args.out / "host_path.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str))
    print("\n".join(table))
    print("\n".join(profiles))


def measure(n: int, rows: list[dict], profiles: list[str]) -> None:
    """Append the host times at length n to rows (and, at N = 128, the profiles)."""

    def record(name: str, us: float) -> None:
        rows.append({"n": n, "call": name, "host_us": round(us, 2)})
        print(f"N={n} {name}: {us:.2f} µs", flush=True)

    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    ke, ve = (x.repeat_interleave(4, dim=1) for x in (k, v))
    qg = q.detach().clone().requires_grad_()
    record(
        "SDPA (default backend, enable_gqa)",
        per_call_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)),
    )
    for label, kind in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(kind):
                us = per_call_us(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True))
        except RuntimeError as e:  # a backend refusing the shape
            print(f"N={n} SDPA {label}: {e}", flush=True)
            continue
        record(f"SDPA {label} (K/V expanded)", us)
    record("torch.empty of out's size", per_call_us(lambda: torch.empty_like(q)))
    for var in (causal, variants.llama3):
        measure_variant(var, q, k, v, qg, record, profiles)


def measure_variant(var, q, k, v, qg, record, profiles: list[str]) -> None:
    """The variant's call (plain and with an input requiring grad under no_grad), its
    generated launch, its CUDA-graph floor and, at N = 128, a profile."""
    n = q.shape[2]
    launch = var.compile(q, k, v).launch
    name = var.__name__
    record(f"{name}(q, k, v)", per_call_us(lambda: var(q, k, v)))
    record(f"{name}(q, k, v), q requires grad, under no_grad", per_call_us(lambda: _no_grad(var, qg, k, v)))
    record(f"generated launch({name}), allocating lse", per_call_us(lambda: launch(q, k, v)))
    record(f"{name}: CUDA-graph replay (GPU floor)", graph_us(lambda: var(q, k, v)))
    if n == 128:
        text = profile_top(lambda: var(q, k, v))
        profiles.append(f"### {name}, N={n}, 2000 calls\n\n```\n{text}\n```\n")


def _no_grad(var, q, k, v):
    with torch.no_grad():
        return var(q, k, v)


if __name__ == "__main__":
    main()
