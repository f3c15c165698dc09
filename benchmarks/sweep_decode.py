"""The decode kernels' tiles and split counts on the GPU: which (BLOCK_N, warps, stages) and how many
splits per (batch, KV head) read the cache fastest, per batch x context, at Llama-3-8B's heads
(Hq 32, Hkv 8, D 128, bf16, one query token, a contiguous cache at full length). The tiling
table's `decode` entries and kernel-path's split cost model (`DECODE_WAVES`,
`DECODE_MIN_SPLIT_KEYS`) are fitted from it.

    python benchmarks/sweep_decode.py --out DIR
    python benchmarks/sweep_decode.py --out DIR --cpu-smoke      # no GPU: interpreter, tiny shapes

Each configuration is compiled with `compile_module(direction="decode", block_n=..., num_warps=...,
num_stages=..., decode_splits=...)` and its `launch` timed with `do_bench_cudagraph` (device time).
Results: DIR/sweep_decode.json, DIR/sweep_decode.md (the fastest configuration per shape, and the
cost model's own choice beside it).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--cpu-smoke" in sys.argv:
    import os

    os.environ["TRITON_INTERPRET"] = "1"

import common as C  # noqa: E402
import torch  # noqa: E402
from bench_decode import plain  # noqa: E402

from attnfuse.compiler import compile_module  # noqa: E402

SHAPES = [(1, 4096), (1, 32768), (8, 8192), (32, 4096), (128, 4096)]
TILES = list(itertools.product((32, 64, 128), (4, 8), (2, 3, 4)))
SPLITS = (0, 1, 2, 4, 8, 16, 32, 64)


def timed(module: Any, q, k, v, lens, lse, smoke: bool) -> float:
    def run() -> Any:
        return module.launch(q, k, v, lens, lse=lse)

    if smoke:
        return C.bench(run)
    import triton.testing

    run()
    return float(triton.testing.do_bench_cudagraph(run, rep=50, return_mode="median"))


def record(b: int, n: int, tile: tuple[int, int, int], splits: int, ms: float, nbytes: int) -> dict[str, Any]:
    """One measurement's row (splits 0: the cost model's)."""
    bn, warps, stages = tile
    return {"batch": b, "context": n, "block_n": bn, "warps": warps, "stages": stages, "splits": splits, "ms": ms,
            "tbs": nbytes / ms / 1e9}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    device, dtype = ("cpu", torch.float16) if smoke else ("cuda", torch.bfloat16)
    hq, hkv, d = (4, 2, 32) if smoke else (32, 8, 128)
    shapes = [(2, 64)] if smoke else SHAPES
    tiles = TILES[:2] if smoke else TILES
    splits = SPLITS[:2] if smoke else SPLITS
    sm = 0 if smoke else 90
    env = C.environment()
    q0 = torch.empty(1, hq, 1, d, dtype=dtype, device="meta")
    k0 = torch.empty(1, hkv, 1, d, dtype=dtype, device="meta")
    ir = plain.ir_module(q0, k0, k0)
    modules: dict[tuple[int, int, int, int], Any] = {}

    def module(bn: int, warps: int, stages: int, n_splits: int) -> Any:
        key = (bn, warps, stages, n_splits)
        if key not in modules:
            src = compile_module(
                ir, sm=sm, direction="decode", block_n=bn, num_warps=warps, num_stages=stages, decode_splits=n_splits
            ).source
            modules[key] = C.load_source(src, interpret=smoke)
        return modules[key]

    rows: list[dict[str, Any]] = []
    for b, n in shapes:
        torch.manual_seed(0)
        q = torch.randn(b, hq, 1, d, device=device, dtype=dtype)
        k = torch.randn(b, hkv, n, d, device=device, dtype=dtype)
        v = torch.randn(b, hkv, n, d, device=device, dtype=dtype)
        lens = torch.full((b,), n, dtype=torch.int32, device=device)
        lse = torch.empty(b * hq, device=device)
        nbytes = 2 * b * hkv * n * d * k.element_size()
        best: tuple[float, tuple[int, int, int]] | None = None
        for bn, warps, stages in tiles:  # the cost model's splits
            try:
                ms = timed(module(bn, warps, stages, 0), q, k, v, lens, lse, smoke)
            except Exception as e:  # noqa: BLE001 (out of resources...)
                C.log(f"{b}x{n} BN{bn} w{warps} s{stages}: {type(e).__name__}: {str(e)[:120]}")
                continue
            rows.append(record(b, n, (bn, warps, stages), 0, ms, nbytes))
            if best is None or ms < best[0]:
                best = (ms, (bn, warps, stages))
        if best is None:
            continue
        bn, warps, stages = best[1]
        for n_splits in splits[1:]:
            ms = timed(module(bn, warps, stages, n_splits), q, k, v, lens, lse, smoke)
            rows.append(record(b, n, (bn, warps, stages), n_splits, ms, nbytes))
        C.log(f"{b}x{n}: best tile BN{bn} w{warps} s{stages} {nbytes / best[0] / 1e9:.2f} TB/s")
        C.write_json(args.out / "sweep_decode.json", {"env": env, "rows": rows})
    (args.out / "sweep_decode.md").write_text(markdown(rows, env))


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [
        "# Decode tiles and splits (plain causal, Llama-3-8B heads, one query token)",
        "",
        C.env_markdown(env),
        "| batch x context | fastest (BN, warps, stages, splits) | TB/s | cost model's splits, same tile | TB/s |",
        "|---|---|---|---|---|",
    ]
    for b, n in dict.fromkeys((r["batch"], r["context"]) for r in rows):
        mine = [r for r in rows if (r["batch"], r["context"]) == (b, n)]
        top = max(mine, key=lambda r: r["tbs"])
        model = [
            r
            for r in mine
            if r["splits"] == 0
            and (r["block_n"], r["warps"], r["stages"]) == (top["block_n"], top["warps"], top["stages"])
        ]
        m = f"{model[0]['tbs']:.2f}" if model else "-"
        lines.append(
            f"| {b} x {n} | {top['block_n']}, {top['warps']}, {top['stages']}, {top['splits'] or 'model'} | "
            f"{top['tbs']:.2f} | model | {m} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
