"""Ablation (the paper's Table 3): what each step of the plain causal kernel is worth.

    python benchmarks/ablation.py --out DIR [--shapes paper] [--ns 1024,4096,16384]
    python benchmarks/ablation.py --out DIR --cpu-smoke     # no GPU: interpreter, tiny shapes

Plain causal attention, compiled four times, each step adding one thing to the one before:

1. `baseline`: no causal split (the `attnfuse-pipeline` option `causal-split=false`: every
   KV block up to Nk is visited and masked), 64x64 tiles, 4 warps, 2 stages;
2. `+ causal split`: KV blocks past the diagonal skipped, blocks below it run without mask
   code, only the diagonal blocks masked;
3. `+ larger tiles`: BLOCK_M 128 (BLOCK_N 64 at D=64, 128 at D=128; 8 warps at D=128);
4. `+ sweep winner`: the sm90 `tiling` table as committed (what AttnFuse uses by default).

Every kernel launches the heaviest Q blocks first (that is not a step here). flex_attention
and SDPA's cuDNN backend are timed in the same process as references. Each output is
checked against the float32 formula before it is timed. Writes DIR/ablation.json and
DIR/ablation.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--cpu-smoke" in sys.argv:
    import os

    os.environ["TRITON_INTERPRET"] = "1"

import bench_forward as BF  # noqa: E402
import common as C  # noqa: E402
import torch  # noqa: E402

from attnfuse.passes import tiling  # noqa: E402


def steps(head_dim: int, sm: int) -> list[tuple[str, dict[str, Any]]]:
    """(label, pipeline options) of the ablation's rows, in order."""
    small = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
    large = {
        "block_m": 128,
        "block_n": 64 if head_dim <= 64 else 128,
        "num_warps": 4 if head_dim <= 64 else 8,
        "num_stages": 2,
    }
    if sm == 0:  # the interpreter: tiles that fit the smoke shapes
        small = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}
        large = {"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 1}
    return [
        ("baseline", {**small, "causal_split": False}),
        ("+ causal split", small),
        ("+ larger tiles", large),
        ("+ sweep winner", {}),
    ]


def table_config(sm: int, head_dim: int) -> dict[str, int]:
    bm, bn, w, s = tiling.lookup(sm, head_dim, "plain")
    return {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": s}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sm = 0 if args.cpu_smoke else C.device_sm()
    all_shapes = C.SMOKE_SHAPES if args.cpu_smoke else C.SHAPES
    shapes = [all_shapes[s] for s in args.shapes.split(",") if s]
    ns = [int(x) for x in args.ns.split(",")] if args.ns else ([64, 96] if args.cpu_smoke else list(C.SEQ_LENS[1:]))
    variant = C.VARIANTS["causal"]
    deadline = time.time() + args.budget_s
    jobs = {
        (shape.name, n, label): C.KernelJob.make("causal", shape, n, sm, args.window, **opts)
        for shape in shapes
        for n in ns
        for label, opts in steps(shape.head_dim, sm)
    }
    built = C.build_all(
        list(jobs.values()), 0 if args.cpu_smoke else args.workers, timeout_s=max(30.0, args.budget_s / 2)
    )
    # flex compiled per shape (dynamic=False), as in the forward grid.
    peers = BF.Peers("cpu" if args.cpu_smoke else "cuda", not args.cpu_smoke, False, args.window)
    runner = BF.Runner(args, peers, sm)
    device = "cpu" if args.cpu_smoke else "cuda"
    cases = [(shape, n) for shape in shapes for n in ns]
    for shape, n in C.progress(cases, len(cases), "ablation"):
        if time.time() > deadline:
            C.log(f"ablation: time budget reached before {shape.name} N={n}")
            break
        inputs = C.make_inputs(variant, shape, n, device, seed=11 + n)
        ref = C.reference_formula(variant, inputs, window=args.window)
        flops = C.attention_flops(variant, shape, n, n, args.window)
        base = {"shape": shape.name, "variant": "causal", "n": n, "flops": flops}
        for label, opts in steps(shape.head_dim, sm):
            b = built[jobs[(shape.name, n, label)]]
            config = opts or table_config(sm, shape.head_dim)
            extra = {
                "step": label,
                "options": {**config, "causal_split": opts.get("causal_split", True)},
                "launch_params": b.launch_params,
            }
            if b.source is None:
                runner.rows.append(
                    {**base, "impl": "attnfuse", **extra, "ok": False, "ms": None, "status": "ERROR", "error": b.error}
                )
                continue
            kern = C.load_source(b.source, interpret=args.cpu_smoke)
            runner.measure(
                base,
                "attnfuse",
                lambda kern=kern, a=inputs.args: kern.launch(*a),
                ref,
                flops,
                computes="full",
                extra=extra,
            )
        runner.peers_rows(variant, shape, n, inputs, ref, None, base, flops)
    return {
        "rows": runner.rows,
        "steps": [s for s, _ in steps(shapes[0].head_dim, sm)] if shapes else [],
        "shapes": {s.name: s.describe() for s in shapes},
    }


def markdown(result: dict[str, Any], env: dict[str, Any], sm: int) -> str:
    rows = result["rows"]
    out = ["# Ablation (Table 3): plain causal forward, one step at a time", "", C.env_markdown(env), ""]
    out.append(
        "Each step adds one thing to the row above (benchmarks/ablation.py). Speed-up: over the "
        "baseline; step: over the row above. flex and cuDNN timed in the same process."
    )
    for shape in dict.fromkeys(r["shape"] for r in rows):
        ns = sorted({r["n"] for r in rows if r["shape"] == shape})
        out += ["", f"## {shape} ({result['shapes'][shape]})", ""]
        heads = " | ".join(f"N={n} ms (TFLOP/s)" for n in ns)
        out.append(f"| step | config | {heads} | speed-up at each N | step |")
        out.append("|---|---|" + "---|" * len(ns) + "---|---|")

        def get(impl: str, n: int, step: str | None = None, shape: str = shape) -> dict[str, Any] | None:
            return next(
                (
                    r
                    for r in rows
                    if r["shape"] == shape
                    and r["n"] == n
                    and r["impl"] == impl
                    and (step is None or r.get("step") == step)
                ),
                None,
            )

        prev: dict[int, float | None] = {}
        for step in result["steps"]:
            cells, ups, step_ups = [], [], []
            config = ""
            for n in ns:
                r = get("attnfuse", n, step)
                ms = r.get("ms") if r else None
                if r and not config:
                    o = r["options"]
                    config = f"{o['block_m']}x{o['block_n']}, {o['num_warps']}w, {o['num_stages']}s" + (
                        "" if o["causal_split"] else ", no split"
                    )
                cells.append(
                    f"{C.fmt(ms)} ({C.fmt(r.get('tflops') if r else None, 0)})" if ms else (r["status"] if r else "—")
                )
                b = get("attnfuse", n, result["steps"][0])
                ups.append(C.fmt(b["ms"] / ms, 2) if ms and b and b.get("ms") else "—")
                step_ups.append(C.fmt(prev[n] / ms, 2) if ms and prev.get(n) else "—")
                prev[n] = ms
            out.append(f"| {step} | {config} | " + " | ".join(cells) + f" | {', '.join(ups)} | {', '.join(step_ups)} |")
        for impl in ("flex", "sdpa_cudnn", "sdpa_math"):
            rs = [get(impl, n) for n in ns]
            if not any(rs):
                continue
            cells = [
                f"{C.fmt(r.get('ms'))} ({C.fmt(r.get('tflops'), 0)})"
                if r and r.get("ms")
                else (r["status"] if r else "—")
                for r in rs
            ]
            last = [get("attnfuse", n, result["steps"][-1]) for n in ns]
            ratio = [
                C.fmt(r["ms"] / a["ms"], 2) if r and r.get("ms") and a and a.get("ms") else "—"
                for r, a in zip(rs, last, strict=True)
            ]
            out.append(f"| {impl} (reference) | — | {' | '.join(cells)} | AttnFuse vs it: {', '.join(ratio)} | |")
    wrong = [r for r in rows if r.get("status") != "ok"]
    out += [
        "",
        f"{len(rows)} rows, {len(wrong)} not ok"
        + (
            ": " + ", ".join(f"{r['impl']} {r.get('step', '')} N={r['n']} {r['status']}" for r in wrong)
            if wrong
            else "."
        ),
    ]
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path, help="folder for ablation.json and ablation.md")
    ap.add_argument("--shapes", default="paper", help="paper and/or llama (comma-separated)")
    ap.add_argument("--ns", default=None, help="sequence lengths (default 1024..16384)")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--window", type=int, default=C.WINDOW)
    C.add_measurement_args(ap)
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s and s not in C.SHAPES]
    if unknown:
        ap.error(f"unknown shapes {', '.join(unknown)}; expected paper and/or llama")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("ablation needs a CUDA GPU (or --cpu-smoke)")
    t0 = time.time()
    env = C.environment()
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    C.write_json(
        args.out / "ablation.json",
        {
            "environment": env,
            "args": {k: str(v) for k, v in vars(args).items()},
            **result,
            "elapsed_s": round(time.time() - t0, 1),
        },
    )
    sm = 0 if args.cpu_smoke else C.device_sm()
    (args.out / "ablation.md").write_text(markdown(result, env, sm))
    C.log(f"ablation done in {time.time() - t0:.0f}s; wrote {args.out / 'ablation.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
