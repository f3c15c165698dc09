"""Tile sweep (the paper's Table 2) and the Rotation Calculus check (Table 4) on the GPU.

    python benchmarks/sweep_tiles.py --out DIR [--part tiles,rotation] [--budget-s 300]
    python benchmarks/sweep_tiles.py --out DIR --cpu-smoke     # no GPU: interpreter, tiny shapes

Part `tiles`: for each entry (a variant, a rope-fusion mode, and the `tiling` variant
class its kernel falls in) at the paper shape (N=4096) and the Llama-3 shape (N=8192),
every configuration of BLOCK_M in {64, 128}, BLOCK_N in {32, 64, 128} (BLOCK_N <=
BLOCK_M: the causal split needs each KV block inside one Q block's diagonal band),
num_warps in {4, 8}, num_stages in {2, 3, 4}: 30 per entry. Each kernel is checked
against the float32 formula before it is timed. Writes DIR/tiles.json and DIR/tiles.md
with the winner per (class, head dim) and the `TILING_TABLE` lines they suggest.

Part `rotation`: rope_causal with K rotated in the KV loop (`fused`) against K rotated
once by a separate kernel (`prerotate`), and plain causal (no RoPE) as the floor, at
N = 512..16384 on both shapes; the measured crossover (from which N on prerotate is
faster) against `attnfuse.passes.rope_fusion.crossover`, the predicted costs against
the measured overheads over plain causal, and what `auto` picks at each N. Writes
DIR/rotation.json and DIR/rotation.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--cpu-smoke" in sys.argv:
    # Library jit functions (tl.cdiv, ...) are interpretable only when triton itself was
    # imported with TRITON_INTERPRET=1, so it must be set before anything imports triton.
    import os

    os.environ["TRITON_INTERPRET"] = "1"

import common as C  # noqa: E402
import torch  # noqa: E402

from attnfuse.passes import rope_fusion, tiling  # noqa: E402


@dataclass(frozen=True)
class Entry:
    """One line of the sweep: a variant compiled in one rope-fusion mode."""

    label: str
    variant: str
    rope_mode: str
    cls: str
    """The `tiling` table's variant class this kernel falls in."""


ENTRIES = {
    e.label: e
    for e in (
        Entry("causal", "causal", "auto", "plain"),
        Entry("rope_causal/fused", "rope_causal", "fused", "kloop"),
        Entry("rope_causal/prerotate", "rope_causal", "prerotate", "plain"),
        Entry("softcap", "softcap", "auto", "mods"),
    )
}
SWEEP_POINTS = {"paper": 4096, "llama": 8192}
SMOKE_POINTS = {"paper": 80, "llama": 80}


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def key(self) -> str:
        return f"BM{self.block_m}/BN{self.block_n}/w{self.num_warps}/s{self.num_stages}"

    def options(self) -> dict[str, int]:
        return {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }


def configs(block_ms: list[int], block_ns: list[int], warps: list[int], stages: list[int]) -> list[Config]:
    """The configuration grid, pruned to BLOCK_N <= 128 and BLOCK_N <= BLOCK_M."""
    return [
        Config(bm, bn, w, s)
        for bm, bn, w, s in itertools.product(block_ms, block_ns, warps, stages)
        if bn <= 128 and bn <= bm
    ]


def run_checked(
    source: str, inputs: C.Inputs, ref: torch.Tensor, args: argparse.Namespace, flops: float
) -> dict[str, Any]:
    """Load, run once, check against `ref`, time: a row's measurement fields."""
    row: dict[str, Any] = {}
    try:
        kern = C.load_source(source, interpret=args.cpu_smoke)
        t0 = time.time()
        out, _ = kern.launch(*inputs.args)
        C.synchronize()
        row["first_call_s"] = round(time.time() - t0, 3)
        check = C.compare(out, ref, args.atol, args.rtol)
        row.update(check.as_dict())
        del out
        ms = C.bench(lambda: kern.launch(*inputs.args), warmup=args.warmup, rep=args.rep)
        if check.ok:
            row.update(ms=ms, tflops=C.tflops(flops, ms), status="ok")
        else:
            row.update(ms=None, ms_unchecked=ms, status="WRONG")
    except Exception as e:  # noqa: BLE001 - one bad config must not stop the sweep
        row.update(ok=False, ms=None, status="ERROR", error=f"{type(e).__name__}: {e}"[:1500])
        if args.verbose:
            traceback.print_exc()
    return row


# ----------------------------------------------------------------------------- tiles


def sweep(
    args: argparse.Namespace,
    sm: int,
    shapes: dict[str, C.Shape],
    points: dict[str, int],
    entries: list[Entry],
    grid: list[Config],
    deadline: float,
) -> dict[str, Any]:
    device = "cpu" if args.cpu_smoke else "cuda"
    points_list = [
        (entry, shape, points[shape.name], cfg) for shape in shapes.values() for entry in entries for cfg in grid
    ]

    def job(entry: Entry, shape: C.Shape, n: int, cfg: Config) -> C.KernelJob:
        return C.KernelJob.make(entry.variant, shape, n, sm, args.window, rope_mode=entry.rope_mode, **cfg.options())

    built = C.build_all(
        [job(*p) for p in points_list],
        0 if args.cpu_smoke else args.workers,
        timeout_s=max(30.0, deadline - time.time() - 60),
    )
    rows: list[dict[str, Any]] = []
    plan = []
    for entry, shape, n, cfg in points_list:
        b = built[job(entry, shape, n, cfg)]
        if b.source is None:
            rows.append(
                {
                    "entry": entry.label,
                    "class": entry.cls,
                    "shape": shape.name,
                    "head_dim": shape.head_dim,
                    "n": n,
                    "config": cfg.key(),
                    **cfg.options(),
                    "status": "ERROR",
                    "ok": False,
                    "ms": None,
                    "error": b.error,
                }
            )
        else:
            plan.append((entry, shape, n, cfg, b.source, b.launch_params))
    plan = interleave(plan, sm)
    inputs_ref: dict[tuple[str, str], tuple[C.Inputs, torch.Tensor]] = {}  # a few hundred MB at most
    skipped = 0
    for entry, shape, n, cfg, src, params in C.progress(plan, len(plan), "tile sweep"):
        if time.time() > deadline:
            skipped += 1
            continue
        key = (entry.variant, shape.name)
        if key not in inputs_ref:
            variant = C.VARIANTS[entry.variant]
            inputs = C.make_inputs(variant, shape, n, device, seed=7 + n)
            inputs_ref[key] = (inputs, C.reference_formula(variant, inputs, window=args.window))
        inputs, ref = inputs_ref[key]
        flops = C.attention_flops(C.VARIANTS[entry.variant], shape, n, n, args.window)
        row = {
            "entry": entry.label,
            "class": entry.cls,
            "shape": shape.name,
            "head_dim": shape.head_dim,
            "n": n,
            "config": cfg.key(),
            **cfg.options(),
            "launch_params": params,
            **run_checked(src, inputs, ref, args, flops),
        }
        if row["status"] != "ok":
            C.log(
                f"  {entry.label} {shape.name} {cfg.key()}: {row['status']} "
                f"{(row.get('error') or '').splitlines()[0][:200] if row.get('error') else ''}"
            )
        rows.append(row)
    if skipped:
        C.log(f"tile sweep: time budget reached, {skipped} configurations not measured")
    return {"rows": rows, "winners": winners(rows, entries, shapes, sm), "skipped_for_budget": skipped}


def interleave(plan: list[tuple], sm: int) -> list[tuple]:
    """Order the measurements round-robin over (entry, shape), each group's table default
    first, so that a run cut short by its time budget still covers every group."""
    groups: dict[tuple[str, str], list[tuple]] = {}
    for item in plan:
        groups.setdefault((item[0].label, item[1].name), []).append(item)
    for items in groups.values():
        entry, shape = items[0][0], items[0][1]
        default = Config(*tiling.lookup(sm, shape.head_dim, entry.cls))
        items.sort(key=lambda it: it[3] != default)
    out = []
    for i in range(max((len(g) for g in groups.values()), default=0)):
        out += [g[i] for g in groups.values() if i < len(g)]
    return out


def winners(rows: list[dict[str, Any]], entries: list[Entry], shapes: dict[str, C.Shape], sm: int) -> list[dict]:
    """Per (entry, shape): the fastest correct configuration and the table default's time."""
    out = []
    for shape in shapes.values():
        for entry in entries:
            sel = [r for r in rows if r["entry"] == entry.label and r["shape"] == shape.name and r.get("ms")]
            if not sel:
                continue
            best = min(sel, key=lambda r: r["ms"])
            default = Config(*tiling.lookup(sm, shape.head_dim, entry.cls))
            base = next((r for r in sel if r["config"] == default.key()), None)
            out.append(
                {
                    "entry": entry.label,
                    "class": entry.cls,
                    "shape": shape.name,
                    "head_dim": shape.head_dim,
                    "n": best["n"],
                    "best": best["config"],
                    "best_ms": best["ms"],
                    "best_tflops": best.get("tflops"),
                    "best_tuple": [best["block_m"], best["block_n"], best["num_warps"], best["num_stages"]],
                    "table_default": default.key(),
                    "default_ms": base["ms"] if base else None,
                    "speedup_vs_default": (base["ms"] / best["ms"]) if base else None,
                    "measured": len(sel),
                }
            )
    return out


def tiles_markdown(result: dict[str, Any], env: dict[str, Any], sm: int) -> str:
    out = [
        "# Tile sweep\n",
        C.env_markdown(env),
        "\nMedian ms (TFLOP/s) per configuration; WRONG/ERROR configurations are excluded from the winners. "
        "Entries: a variant and its rope-fusion mode; `class` is the `tiling` table's variant class.\n",
        "\n## Winners\n",
        "| entry | class | shape (D) | N | best | ms | TFLOP/s | table default | default ms | best / default |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in result["winners"]:
        out.append(
            f"| {w['entry']} | {w['class']} | {w['shape']} ({w['head_dim']}) | {w['n']} | {w['best']} | "
            f"{w['best_ms']:.3f} | {C.fmt(w['best_tflops'], 0)} | {w['table_default']} | "
            f"{C.fmt(w['default_ms'])} | {C.fmt(w['speedup_vs_default'], 2)}× |"
        )
    # The table lines the winners suggest: one per (class, head-dim bucket); for `plain`
    # both plain causal and prerotated RoPE fall in the class, plain causal decides.
    suggestions: dict[tuple[int, int, str], tuple[list[int], str]] = {}
    for w in result["winners"]:
        bucket = 64 if w["head_dim"] <= 64 else 128 if w["head_dim"] <= 128 else 256
        key = (sm or 90, bucket, w["class"])
        if key not in suggestions or w["entry"] == "causal":
            suggestions[key] = (w["best_tuple"], w["entry"])
    if suggestions:
        out += ["\n## Suggested `TILING_TABLE` entries\n", "```python"]
        for (s, d, cls), (t, entry) in sorted(suggestions.items()):
            out.append(f'    ({s}, {d}, "{cls}"): ({t[0]}, {t[1]}, {t[2]}, {t[3]}),  # from {entry}')
        out.append("```")
    for shape_name in sorted({r["shape"] for r in result["rows"]}):
        for entry in sorted({r["entry"] for r in result["rows"] if r["shape"] == shape_name}):
            sel = [r for r in result["rows"] if r["shape"] == shape_name and r["entry"] == entry]
            sel.sort(key=lambda r: (r.get("ms") is None, r.get("ms") or 0))
            out += [
                f"\n## {entry}, {shape_name} (D={sel[0]['head_dim']}, N={sel[0]['n']})\n",
                "| config | ms | TFLOP/s | status |",
                "|---|---|---|---|",
            ]
            for r in sel:
                out.append(f"| {r['config']} | {C.fmt(r.get('ms'))} | {C.fmt(r.get('tflops'), 0)} | {r['status']} |")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- rotation


def predicted_crossover(sm: int, shape: C.Shape, block_m: int) -> dict[str, Any]:
    """rope_fusion.crossover as the pass calls it (its defaults) and with this shape's
    batch and the fused kernel's BLOCK_M (when the model takes them)."""
    model_sm = sm if sm else 90
    out: dict[str, Any] = {
        "as_pass_calls_it": rope_fusion.crossover(model_sm, shape.q_heads, shape.kv_heads, shape.head_dim, True)
    }
    try:
        out["with_batch_and_block_m"] = rope_fusion.crossover(
            model_sm, shape.q_heads, shape.kv_heads, shape.head_dim, True, block_m=block_m, batch=shape.batch
        )
    except TypeError as e:
        out["with_batch_and_block_m"] = f"n/a ({e})"
    return out


def predicted_costs(sm: int, shape: C.Shape, n: int, block_m: int) -> tuple[float | None, float | None]:
    """(fused, prerotate) extra microseconds the Rotation Calculus predicts for K."""
    try:
        fused, pre = rope_fusion.rotation_costs(
            sm or 90, n, shape.q_heads, shape.kv_heads, shape.head_dim, True, block_m=block_m, batch=shape.batch
        )
        return fused * 1e6, pre * 1e6
    except Exception:  # noqa: BLE001 - the model's signature may change; the report says so
        return None, None


def rotation(
    args: argparse.Namespace, sm: int, shapes: dict[str, C.Shape], ns: list[int], deadline: float
) -> dict[str, Any]:
    device = "cpu" if args.cpu_smoke else "cuda"
    rope_v, plain_v = C.VARIANTS["rope_causal"], C.VARIANTS["causal"]
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    kinds = (("plain", plain_v, "auto"), ("fused", rope_v, "fused"), ("prerotate", rope_v, "prerotate"))

    def job(shape: C.Shape, n: int, variant: C.BenchVariant, mode: str) -> C.KernelJob:
        return C.KernelJob.make(variant.name, shape, n, sm, args.window, rope_mode=mode)

    wanted = [
        job(shape, n, v, mode)
        for shape in shapes.values()
        for n in ns
        for _, v, mode in (*kinds, ("auto", rope_v, "auto"))
    ]
    built = C.build_all(wanted, 0 if args.cpu_smoke else args.workers, timeout_s=max(30.0, deadline - time.time() - 30))
    plan: dict[tuple[str, int, str], tuple[str, dict]] = {}
    auto_choice: dict[tuple[str, int], str] = {}
    for shape in shapes.values():
        for n in ns:
            for kind, v, mode in kinds:
                b = built[job(shape, n, v, mode)]
                if b.source is None:
                    rows.append(
                        {"shape": shape.name, "n": n, "kind": kind, "status": "ERROR", "ms": None, "error": b.error}
                    )
                else:
                    plan[(shape.name, n, kind)] = (b.source, b.launch_params)
            auto = built[job(shape, n, rope_v, "auto")]
            auto_choice[(shape.name, n)] = (
                f"error: {auto.error}"
                if auto.source is None
                else next(
                    (k for k in ("fused", "prerotate") if plan.get((shape.name, n, k), ("",))[0] == auto.source),
                    "other",
                )
            )
    for shape in shapes.values():
        fused_bm = tiling.lookup(sm or 90, shape.head_dim, "kloop")[0]
        measured: dict[tuple[int, str], float | None] = {}
        for n in C.progress(ns, len(ns), f"rotation {shape.name}"):
            if time.time() > deadline:
                C.log(f"rotation: time budget reached before {shape.name} N={n}")
                break
            inputs = C.make_inputs(rope_v, shape, n, device, seed=11 + n)
            refs: dict[str, torch.Tensor] = {}
            for kind, v, _ in kinds:
                if (shape.name, n, kind) not in plan:
                    continue
                src, params = plan[(shape.name, n, kind)]
                if v.name not in refs:
                    refs[v.name] = C.reference_formula(v, inputs, window=args.window)
                ref = refs[v.name]
                flops = C.attention_flops(v, shape, n, n, args.window)
                row = {
                    "shape": shape.name,
                    "n": n,
                    "kind": kind,
                    "launch_params": params,
                    **run_checked(src, inputs, ref, args, flops),
                }
                rows.append(row)
                measured[(n, kind)] = row.get("ms")
            del refs
            f_us, p_us = predicted_costs(sm, shape, n, fused_bm)
            t_plain, t_fused, t_pre = (measured.get((n, k)) for k in ("plain", "fused", "prerotate"))
            faster = None if not (t_fused and t_pre) else ("fused" if t_fused <= t_pre else "prerotate")
            summary.append(
                {
                    "shape": shape.name,
                    "n": n,
                    "plain_ms": t_plain,
                    "fused_ms": t_fused,
                    "prerotate_ms": t_pre,
                    "speedup_fused_over_prerotate": (t_pre / t_fused) if t_fused and t_pre else None,
                    "fused_overhead_us": (t_fused - t_plain) * 1e3 if t_fused and t_plain else None,
                    "prerotate_overhead_us": (t_pre - t_plain) * 1e3 if t_pre and t_plain else None,
                    "predicted_fused_us": f_us,
                    "predicted_prerotate_us": p_us,
                    "faster": faster,
                    "auto_choice": auto_choice.get((shape.name, n)),
                    "auto_is_faster": None if faster is None else auto_choice.get((shape.name, n)) == faster,
                }
            )
    crossovers = []
    for shape in shapes.values():
        sel = [s for s in summary if s["shape"] == shape.name and s["faster"]]
        measured_x = None
        if sel:
            # the smallest N from which prerotate wins at every larger measured N
            for s in sel:
                if all(t["faster"] == "prerotate" for t in sel if t["n"] >= s["n"]):
                    measured_x = s["n"]
                    break
        fused_bm = tiling.lookup(sm or 90, shape.head_dim, "kloop")[0]
        crossovers.append(
            {
                "shape": shape.name,
                "measured_crossover": measured_x
                if measured_x is not None
                else (f"> {max(s['n'] for s in sel)}" if sel else None),
                "prerotate_wins_everywhere": bool(sel) and all(s["faster"] == "prerotate" for s in sel),
                "predicted": predicted_crossover(sm, shape, fused_bm),
            }
        )
    return {"rows": rows, "summary": summary, "crossovers": crossovers}


def rotation_markdown(result: dict[str, Any], env: dict[str, Any]) -> str:
    out = [
        "# Rotation Calculus: K rotated in the KV loop (fused) vs once by a separate kernel (prerotate)\n",
        C.env_markdown(env),
        "\nrope_causal (theta 10000, half, rotary_dim = D) vs plain causal at the table's tiles. Overheads are "
        "over plain causal; predictions from `attnfuse.passes.rope_fusion.rotation_costs`. "
        "fused/prerotate speed-up = prerotate ms / fused ms (> 1: fusing pays).\n",
        "\n## Crossover\n",
        "| shape | measured (prerotate faster from N on) | predicted (as the pass calls "
        "the model) | predicted (batch, BLOCK_M) |",
        "|---|---|---|---|",
    ]
    for c in result["crossovers"]:
        p = c["predicted"]
        out.append(
            f"| {c['shape']} | {c['measured_crossover']} | {p.get('as_pass_calls_it')} | "
            f"{p.get('with_batch_and_block_m')} |"
        )
    for shape in sorted({s["shape"] for s in result["summary"]}):
        out += [
            f"\n## {shape}\n",
            "| N | plain ms | fused ms | prerotate ms | fused/prerotate speed-up | fused overhead µs "
            "(predicted) | prerotate overhead µs (predicted) | faster | auto chose |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for s in result["summary"]:
            if s["shape"] != shape:
                continue
            out.append(
                f"| {s['n']} | {C.fmt(s['plain_ms'])} | {C.fmt(s['fused_ms'])} | {C.fmt(s['prerotate_ms'])} | "
                f"{C.fmt(s['speedup_fused_over_prerotate'], 2)} | {C.fmt(s['fused_overhead_us'], 1)} "
                f"({C.fmt(s['predicted_fused_us'], 1)}) | {C.fmt(s['prerotate_overhead_us'], 1)} "
                f"({C.fmt(s['predicted_prerotate_us'], 1)}) | {s['faster'] or '—'} | {s['auto_choice']}"
                f"{'' if s['auto_is_faster'] in (None, True) else ' (slower)'} |"
            )
    bad = [r for r in result["rows"] if r.get("status") != "ok"]
    if bad:
        out += ["\n## Failed runs\n"] + [
            f"- {r['shape']} N={r['n']} {r['kind']}: {r['status']} {(r.get('error') or '')[:200]}" for r in bad
        ]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- main


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path, help="folder for tiles.* and rotation.*")
    ap.add_argument("--part", default="tiles,rotation", help="tiles, rotation or both (comma-separated)")
    ap.add_argument("--entries", default=",".join(ENTRIES), help=f"sweep entries, of {','.join(ENTRIES)}")
    ap.add_argument("--shapes", default="paper,llama")
    ap.add_argument("--block-m", default="64,128")
    ap.add_argument("--block-n", default="32,64,128")
    ap.add_argument("--num-warps", default="4,8")
    ap.add_argument("--num-stages", default="2,3,4")
    ap.add_argument("--ns", default=None, help="rotation part: sequence lengths (default 512..16384)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=330.0,
        help="stop measuring after this many seconds (what was measured is written)",
    )
    ap.add_argument("--window", type=int, default=C.WINDOW)
    C.add_measurement_args(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("sweep_tiles needs a CUDA GPU (or --cpu-smoke)")
    t0 = time.time()
    deadline = t0 + args.budget_s
    parts = {p.strip() for p in args.part.split(",") if p.strip()}
    bad = parts - {"tiles", "rotation"}
    if bad:
        raise SystemExit(f"unknown --part {', '.join(sorted(bad))}; expected tiles and/or rotation")
    unknown = [e for e in args.entries.split(",") if e and e not in ENTRIES]
    if unknown:
        raise SystemExit(f"unknown entries {', '.join(unknown)}; expected some of {', '.join(ENTRIES)}")
    all_shapes = C.SMOKE_SHAPES if args.cpu_smoke else C.SHAPES
    shapes = {s: all_shapes[s] for s in args.shapes.split(",") if s}
    sm = 0 if args.cpu_smoke else C.device_sm()
    env = C.environment()
    args.out.mkdir(parents=True, exist_ok=True)
    C.log(f"sweep_tiles: parts {sorted(parts)}, sm {sm}, {env.get('gpu', 'cpu')}")
    if args.cpu_smoke:  # the interpreter runs the grid too, but slowly: a corner of it
        grid = configs([32], [16, 32], [4], [1])
        points, ns = SMOKE_POINTS, ints(args.ns) if args.ns else [48, 80]
    else:
        grid = configs(ints(args.block_m), ints(args.block_n), ints(args.num_warps), ints(args.num_stages))
        points, ns = SWEEP_POINTS, ints(args.ns) if args.ns else list(C.SEQ_LENS)
    meta = {"environment": env, "args": {k: str(v) for k, v in vars(args).items()}}
    if "tiles" in parts:
        entries = [ENTRIES[e] for e in args.entries.split(",") if e]
        C.log(f"tile sweep: {len(grid)} configurations x {len(entries)} entries x {len(shapes)} shapes")
        # The rotation part needs little time: keep ~15% of the budget for it.
        tiles_deadline = deadline - (0.15 * args.budget_s if "rotation" in parts else 0)
        result = sweep(args, sm, shapes, points, entries, grid, tiles_deadline)
        C.write_json(args.out / "tiles.json", {**meta, **result, "elapsed_s": round(time.time() - t0, 1)})
        (args.out / "tiles.md").write_text(tiles_markdown(result, env, sm))
        for w in result["winners"]:
            C.log(
                f"  winner {w['entry']:24s} {w['shape']:6s} {w['best']:22s} {w['best_ms']:.3f} ms "
                f"({C.fmt(w['best_tflops'], 0)} TFLOP/s); table default {w['table_default']} "
                f"{C.fmt(w['default_ms'])} ms"
            )
    if "rotation" in parts:
        result = rotation(args, sm, shapes, ns, deadline)
        C.write_json(args.out / "rotation.json", {**meta, **result, "elapsed_s": round(time.time() - t0, 1)})
        (args.out / "rotation.md").write_text(rotation_markdown(result, env))
        for c in result["crossovers"]:
            C.log(f"  crossover {c['shape']}: measured {c['measured_crossover']}, predicted {c['predicted']}")
        for s in result["summary"]:
            C.log(
                f"  {s['shape']:6s} N={s['n']:6d} plain {C.fmt(s['plain_ms'])} fused {C.fmt(s['fused_ms'])} "
                f"prerotate {C.fmt(s['prerotate_ms'])} ms; faster {s['faster']}, auto {s['auto_choice']}"
            )
    C.log(f"sweep_tiles done in {time.time() - t0:.0f}s; wrote to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
