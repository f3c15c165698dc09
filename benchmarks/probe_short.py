"""Short sequences and host time on the GPU (issue 22, items 3 and 4): is plain causal at small N
slower than RoPE+causal because of the kernel, or because of the order it was measured in?

    python benchmarks/probe_short.py --out DIR

Llama-3-8B heads (B1, Hq 32, Hkv 8, D 128, bf16), through the public API (`af.backend("auto")`):

1. device time (`do_bench` median, ms) of plain causal, RoPE+causal and SDPA cuDNN at N = 512,
   1024, 2048 and 4096, measured in the order plain, RoPE, plain again, before and after 1 s of
   GPU work (the clocks idle at 345 MHz when a run starts);
2. host time per cache-hit call at N = 128 (wall time of 2000 calls without synchronising:
   what the Python side costs), AttnFuse plain and RoPE against SDPA in the same process.

Writes DIR/probe_short.json and prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import attnfuse as af  # noqa: E402
from attnfuse import variants  # noqa: E402


@af.variant
def plain_causal(q, k, v):  # type: ignore[no-untyped-def]
    return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)


def inputs(n: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(1, h, n, 128, device="cuda", dtype=torch.bfloat16) for h in (32, 8, 8))


def _calls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Any]:
    return {
        "plain": lambda: plain_causal(q, k, v),
        "rope": lambda: variants.llama3(q, k, v),
        "plain again": lambda: plain_causal(q, k, v),
        "sdpa_cudnn": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    }


def device_times(rows: list[dict[str, Any]], phase: str) -> None:
    for n in (512, 1024, 2048, 4096):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for name, fn in _calls(*inputs(n)).items():
                fn()
                rows.append({"part": "device", "phase": phase, "n": n, "impl": name, "ms": C.bench(fn)})
                C.log(str(rows[-1]))


def host_times(rows: list[dict[str, Any]]) -> None:
    calls = _calls(*inputs(128))  # SDPA here with its default backend choice
    del calls["plain again"]
    for _ in range(2):  # two rounds: the second is the one kept
        for name, fn in calls.items():
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            us = (time.perf_counter() - t0) / 2000 * 1e6
            torch.cuda.synchronize()
            rows.append({"part": "host", "impl": name, "us_per_call": us})
    C.log(str(rows[-3:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = C.environment()
    rows: list[dict[str, Any]] = []
    with af.backend("auto"):
        device_times(rows, "cold")
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            x @ x
        torch.cuda.synchronize()
        device_times(rows, "warm")
        host_times(rows)
    C.write_json(args.out / "probe_short.json", {"environment": env, "rows": rows})
    print(C.env_markdown(env))
    print("| phase | N | plain | rope | plain again | sdpa_cudnn |\n|---|---|---|---|---|---|")
    for phase in ("cold", "warm"):
        for n in (512, 1024, 2048, 4096):
            ms = {r["impl"]: r["ms"] for r in rows if r["part"] == "device" and r["phase"] == phase and r["n"] == n}
            print(f"| {phase} | {n} | " + " | ".join(f"{ms[i]:.4f}" for i in ("plain", "rope", "plain again",
                                                                             "sdpa_cudnn")) + " |")  # fmt: skip
    print("\n| call at N = 128 | host µs per call |\n|---|---|")
    for r in [r for r in rows if r["part"] == "host"][-3:]:
        print(f"| {r['impl']} | {r['us_per_call']:.1f} |")


if __name__ == "__main__":
    main()
