"""Plots of a forward benchmark run (`bench_forward.py`'s forward.json) as PNG files.

    pip install matplotlib          # a benchmark-only dependency, not in setup.cfg
    python benchmarks/plot.py RESULTS_DIR [--json PATH] [--out DIR]

forward.json is looked for in RESULTS_DIR, then in its `full/`, `forward/` and `quick/`
folders (the layouts `run_all.sh` and the committed runs use); `--json` names it
directly. The PNGs go to `--out` (default RESULTS_DIR):

- `speedup_<variant>.png`, one per variant in the file: one panel per shape, the
  speed-up of AttnFuse (rope-fusion `auto`) over each peer measured for that variant
  (rope+flex, rope+cuDNN, flex, cuDNN), i.e. peer ms / AttnFuse ms, against N, with the
  1.0 line (above it AttnFuse is faster). On a RoPE variant, plain `flex` and `cuDNN`
  compute the attention *without* RoPE, so those curves show what RoPE costs AttnFuse
  next to a peer that skips it. For `rope_causal` the issue-5 targets against rope+flex
  are drawn too.
- `tflops_rope_causal.png`: TFLOP/s against N of AttnFuse (auto and both forced
  rope-fusion modes) and the peers with a separate RoPE, plus cuDNN without RoPE for
  reference, one panel per shape.

Only rows whose output passed the check against the float32 formula (status `ok`) are
plotted. Rows at N <= 1024 are shaded: there a call takes tens of microseconds and is
dominated by launches, so single runs disagree by more than the differences plotted.
Every figure names the GPU, the run's date and the library versions.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SEARCH = ("", "full", "forward", "quick")
"""Sub-folders of RESULTS_DIR searched for forward.json, in this order."""

SHAPE_LABELS = {
    "paper": "paper shape (B=4, H=12, D=64, fp16)",
    "llama": "Llama-3-8B shape (B=1, Hq=32, Hkv=8, D=128, bf16)",
}

VARIANT_ORDER = ("rope_causal", "causal", "qknorm_rope", "softcap", "alibi", "sliding_window")

PEERS = (
    # impl key, legend label, colour, marker
    ("rope+flex", "vs rope+flex", "tab:blue", "o"),
    ("rope+sdpa_cudnn", "vs rope+cuDNN", "tab:red", "s"),
    ("flex", "vs flex", "tab:cyan", "^"),
    ("sdpa_cudnn", "vs cuDNN", "tab:orange", "D"),
)
"""The peers a speed-up is taken against (those present for a variant are plotted)."""

TFLOPS_LINES = (
    # impl key, legend label, colour, line style, marker
    ("attnfuse", "AttnFuse (auto)", "black", "-", "o"),
    ("attnfuse_prerotate", "AttnFuse, K pre-rotated", "tab:gray", ":", "x"),
    ("attnfuse_fused", "AttnFuse, K rotated in loop", "tab:brown", ":", "+"),
    ("rope+flex", "rope + flex", "tab:blue", "-", "o"),
    ("rope+sdpa_flash", "rope + SDPA flash", "tab:green", "-", "v"),
    ("rope+sdpa_cudnn", "rope + cuDNN", "tab:red", "-", "s"),
    ("sdpa_cudnn", "cuDNN, no RoPE (reference)", "tab:orange", "--", "D"),
)

NOISY_N = 1024
"""Rows at N <= NOISY_N are launch-dominated; their panels' region is shaded."""

ROPE_FLEX_TARGET = ((2048, 2.1), (None, 1.5))
"""Issue 5: RoPE+causal >= 2.1x rope+flex for N <= 2048, >= 1.5x beyond."""
LLAMA_TFLOPS_TARGET = (16384, 550.0)
"""Issue 5: Llama shape, N = 16384, RoPE+causal >= 550 TFLOP/s."""


class PlotError(Exception):
    """Input the script cannot plot (missing file, unexpected JSON)."""


def find_json(results_dir: Path) -> Path:
    """The forward.json of a results folder (see SEARCH)."""
    if not results_dir.is_dir():
        raise PlotError(f"{results_dir} is not a folder; expected a results folder holding forward.json")
    for sub in SEARCH:
        path = results_dir / sub / "forward.json"
        if path.is_file():
            return path
    looked = ", ".join(str(results_dir / s / "forward.json") for s in SEARCH)
    raise PlotError(f"no forward.json in {results_dir}; looked for {looked} (or pass --json PATH)")


def load(path: Path) -> dict[str, Any]:
    """forward.json, checked to have the `environment` and `rows` bench_forward writes."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PlotError(f"cannot read {path} as JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise PlotError(f"{path} has no list 'rows'; expected bench_forward.py's forward.json")
    needed = {"shape", "variant", "n", "impl", "ms"}
    for i, row in enumerate(data["rows"]):
        if not isinstance(row, dict) or not needed <= row.keys():
            raise PlotError(f"{path}: row {i} lacks some of {sorted(needed)}")
    return data


def timings(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[int, dict[str, Any]]]:
    """Valid rows (status ok, a time) by (shape, variant, impl), then N."""
    out: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        if r.get("status", "ok") != "ok" or not r.get("ms"):
            continue
        out.setdefault((r["shape"], r["variant"], r["impl"]), {})[int(r["n"])] = r
    return out


def caption(env: dict[str, Any], source: Path) -> str:
    """One line naming the GPU, date, clocks and versions of the run, and the data file."""
    smi = env.get("nvidia_smi", "")
    clocks = ""
    lines = smi.splitlines()
    if len(lines) == 2:
        fields = dict(
            zip((h.strip() for h in lines[0].split(",")), (v.strip() for v in lines[1].split(",")), strict=False)
        )
        sm, sm_max = fields.get("clocks.current.sm [MHz]"), fields.get("clocks.max.sm [MHz]")
        if sm and sm_max:
            clocks = f", SM clock {sm} before the run (max {sm_max})"
    return (
        f"{env.get('gpu', 'unknown GPU')} (sm {env.get('sm', '?')}){clocks}; torch {env.get('torch')}, "
        f"triton {env.get('triton')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn', '-')}; "
        f"do_bench medians; data: {source}"
    )


def setup_axis(ax: Any, ns: Sequence[int]) -> None:
    """log2 N axis with a tick per measured N, and the launch-dominated region shaded."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ns))
    ax.set_xticklabels([str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("sequence length N")
    ax.grid(True, which="major", alpha=0.3)
    small = [n for n in ns if n <= NOISY_N]
    if small:
        ax.axvspan(
            min(ns) / 1.3, max(small) * 1.3, color="0.92", zorder=0, label=f"N ≤ {NOISY_N}: launch-dominated, noisy"
        )


def title(env: dict[str, Any], what: str) -> str:
    return f"{what}: {env.get('gpu', 'GPU')}, run of {env.get('date_utc', '?')} UTC"


def save(plt: Any, fig: Any, heading: str, footer: str, path: Path) -> Path:
    """Title and caption the figure, write it to `path` and close it."""
    fig.suptitle(heading, fontsize=11)
    fig.text(0.5, 0.01, footer, ha="center", fontsize=7, color="0.3")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speedup(
    plt: Any, table: dict, env: dict[str, Any], variant: str, shapes: list[str], source: Path, out: Path
) -> Path | None:
    """speedup_<variant>.png: AttnFuse (auto) over each peer, one panel per shape."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    present = [s for s in shapes if (s, variant, "attnfuse") in table]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(6.4 * len(present), 4.8), squeeze=False)
    for ax, shape in zip(axes[0], present, strict=True):
        ours = table[(shape, variant, "attnfuse")]
        ns = sorted(ours)
        setup_axis(ax, ns)
        ratios: list[float] = []
        for key, label, colour, marker in PEERS:
            theirs = table.get((shape, variant, key))
            if not theirs:
                continue
            xs = [n for n in ns if n in theirs]
            ys = [theirs[n]["ms"] / ours[n]["ms"] for n in xs]
            ratios += ys
            ax.plot(xs, ys, marker=marker, color=colour, label=label)
        if variant == "rope_causal" and (shape, variant, "rope+flex") in table:
            xs, ys = [], []
            for n in ns:
                target = next(t for limit, t in ROPE_FLEX_TARGET if limit is None or n <= limit)
                xs.append(n)
                ys.append(target)
            ax.step(xs, ys, where="post", color="tab:blue", linestyle=":", label="target vs rope+flex")
            ratios += ys
        ax.axhline(1.0, color="black", linewidth=1.2, label="1.0 (parity)")
        ax.set_yscale("log")
        lo, hi = min(ratios + [1.0]), max(ratios + [1.0])
        ax.set_ylim(lo / 1.25, hi * 1.25)
        ticks = [
            t for t in (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0) if lo / 1.25 <= t <= hi * 1.25
        ]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.set_ylabel("speed-up = peer ms / AttnFuse ms (> 1: AttnFuse faster)")
        ax.set_title(SHAPE_LABELS.get(shape, shape), fontsize=10)
        ax.legend(fontsize=8, loc="best")
    note = ""
    if any((s, variant, "rope+flex") in table for s in present):
        note = " (plain flex / cuDNN compute it without RoPE)"
    return save(
        plt,
        fig,
        title(env, f"AttnFuse forward speed-up, {variant}{note}"),
        caption(env, source),
        out / f"speedup_{variant}.png",
    )


def plot_tflops(
    plt: Any, table: dict, env: dict[str, Any], shapes: list[str], source: Path, out: Path, variant: str = "rope_causal"
) -> Path | None:
    """tflops_<variant>.png: TFLOP/s of AttnFuse and the peers, one panel per shape."""
    present = [s for s in shapes if (s, variant, "attnfuse") in table]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(6.4 * len(present), 4.8), squeeze=False)
    for ax, shape in zip(axes[0], present, strict=True):
        ns = sorted(table[(shape, variant, "attnfuse")])
        setup_axis(ax, ns)
        for key, label, colour, style, marker in TFLOPS_LINES:
            rows = table.get((shape, variant, key))
            if not rows:
                continue
            xs = [n for n in ns if n in rows and rows[n].get("tflops")]
            ax.plot(
                xs,
                [rows[n]["tflops"] for n in xs],
                linestyle=style,
                marker=marker,
                color=colour,
                label=label,
                linewidth=2.0 if key == "attnfuse" else 1.2,
            )
        target_n, target = LLAMA_TFLOPS_TARGET
        if shape == "llama" and variant == "rope_causal" and target_n in ns:
            ax.plot(
                [target_n],
                [target],
                linestyle="none",
                marker="*",
                markersize=14,
                color="tab:purple",
                label=f"target ≥ {target:.0f} TFLOP/s at N={target_n}",
            )
        ax.set_ylim(bottom=0)
        ax.set_ylabel("TFLOP/s (4·B·Hq·D·N²/2 per forward)")
        ax.set_title(SHAPE_LABELS.get(shape, shape), fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    return save(
        plt, fig, title(env, f"Forward TFLOP/s, {variant}"), caption(env, source), out / f"tflops_{variant}.png"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir", type=Path, help="a results folder holding forward.json (or full/forward.json)")
    ap.add_argument("--json", type=Path, default=None, help="forward.json to plot (default: found in RESULTS_DIR)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default RESULTS_DIR)")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    try:
        source = args.json if args.json is not None else find_json(args.results_dir)
        data = load(source)
    except PlotError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    out = args.out if args.out is not None else args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    env = data.get("environment", {})
    table = timings(data["rows"])
    shapes = [s for s in ("paper", "llama") if any(k[0] == s for k in table)]
    shapes += sorted({k[0] for k in table} - set(shapes))
    variants = [v for v in VARIANT_ORDER if any(k[1] == v for k in table)]
    variants += sorted({k[1] for k in table} - set(variants))
    try:
        shown = source.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = source
    written = [plot_speedup(plt, table, env, v, shapes, shown, out) for v in variants]
    written.append(plot_tflops(plt, table, env, shapes, shown, out))
    done = [p for p in written if p is not None]
    if not done:
        print(f"plot.py: {source} has no AttnFuse rows to plot", file=sys.stderr)
        return 1
    for p in done:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
