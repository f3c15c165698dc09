"""Host time of a cache-hit call (issue 22's target: <= SDPA's, in the same process), on the
GPU, in one process.

    python benchmarks/host_path.py [--out DIR] [--ns 128,512,2048]

Llama-3-8B's attention shape (B=1, Hq=32, Hkv=8, D=128, bf16). Host time per call is the time
to *issue* a burst of calls (200, not synchronised inside the burst: the GPU's launch queue
holds them all, so it is the host's time whatever the kernels take), median of 15 bursts, the
cases interleaved burst by burst so that a slow spell of the host hits them all alike:

- SDPA with `enable_gqa=True` (PyTorch's own choice of backend; a backend forced by a context
  manager would time the context manager too);
- one `torch.empty_like` of the output (what an allocation costs on this host);
- for plain causal and RoPE+causal (Llama 3's RoPE): the variant call (what users run) and the
  generated `launch()` called directly (no runtime), allocating its own lse;

then, per variant, the same call replayed from a CUDA graph (the GPU-only floor, which also
checks that the call captures), and at the first N a cProfile of 2000 variant calls (the top
functions by own time). Results: `host_path.md` and `host_path.json` in --out.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

import attnfuse as af  # noqa: E402
from attnfuse import variants  # noqa: E402


@af.variant
def causal(q, k, v):
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def per_call_us(fn, calls: int = 3000, repeats: int = 7) -> float:
    """Median over `repeats` of the mean time of `calls` back-to-back calls (µs), including the
    final synchronisation (the CUDA-graph floor's measure)."""
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


def issue_us(cases: dict, calls: int = 200, bursts: int = 15) -> dict:
    """Per case, the median over `bursts` of the host time to issue `calls` calls (µs per
    call), the cases interleaved burst by burst; the GPU catches up between bursts, untimed."""
    times: dict = {name: [] for name in cases}
    for fn in cases.values():
        fn()
    for _ in range(bursts):
        for name, fn in cases.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return {name: statistics.median(t) for name, t in times.items()}


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
    ap.add_argument("--ns", default="128,512,2048")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("host_path.py measures GPU calls and needs CUDA")
    args.out.mkdir(parents=True, exist_ok=True)
    env = C.environment()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows: list[dict] = []
    profiles: list[str] = []
    for i, n in enumerate(int(x) for x in args.ns.split(",")):
        measure(n, rows, profiles, profile=i == 0)
    table = ["| N | call | host µs per call | vs SDPA (default backend) |", "|---|---|---|---|"]
    for r in rows:
        sdpa = next(x["host_us"] for x in rows if x["n"] == r["n"] and x["call"].startswith("SDPA (default"))
        table.append(f"| {r['n']} | {r['call']} | {r['host_us']} | {r['host_us'] / sdpa:.2f}x |")
    (args.out / "host_path.md").write_text(
        "# Host time per call\n\n" + C.env_markdown(env) + "\n\n" + "\n".join(table) + "\n\n" + "\n".join(profiles)
    )
    (args.out / "host_path.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str))
    print("\n".join(table))
    print("\n".join(profiles))


def measure(n: int, rows: list[dict], profiles: list[str], profile: bool) -> None:
    """Append the host times at length n to rows (and, with `profile`, the profiles)."""
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    cases = {
        "SDPA (default backend, enable_gqa)": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        )
    }
    cases["torch.empty_like of out"] = lambda: torch.empty_like(q)
    for var in (causal, variants.llama3):
        launch = var.compile(q, k, v).launch
        cases[f"{var.__name__}(q, k, v)"] = functools.partial(var, q, k, v)
        cases[f"generated launch({var.__name__}), allocating lse"] = functools.partial(launch, q, k, v)
    for name, us in issue_us(cases).items():
        rows.append({"n": n, "call": name, "host_us": round(us, 2)})
        print(f"N={n} {name}: {us:.2f} µs", flush=True)
    for var in (causal, variants.llama3):
        us = graph_us(lambda var=var: var(q, k, v))
        rows.append({"n": n, "call": f"{var.__name__}: CUDA-graph replay (GPU floor)", "host_us": round(us, 2)})
        if profile:
            text = profile_top(lambda var=var: var(q, k, v))
            profiles.append(f"### {var.__name__}, N={n}, 2000 calls\n\n```\n{text}\n```\n")


if __name__ == "__main__":
    main()
