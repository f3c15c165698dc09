"""Plots of the Gluon backward's runs (PNG files next to the JSON they read).

    python benchmarks/gluon/plot_backward.py RESULTS_DIR

- `backward_ab.png` from RESULTS_DIR/backward_ab.json (`backward_ab.py`): per shape, the Gluon
  backward's speed-up over the generic backward (generic ms / Gluon ms) per variant and N, with
  dQ by TMA reduce-adds (`dq-reduce`, the default since 2026-12-03) and by the ordered kernel (in
  files written before then, `gluon` was the ordered form and `reduce` the reduce-adds), any other
  build of the file (`--configs` labels) as its own bars, and the 1.0 line.
- `backward_vs_cudnn.png` from RESULTS_DIR/backward_quick.json, else backward.json (`bench_backward.py`): per shape,
  AttnFuse's fwd+bwd and backward-alone speed-up over the peer with cuDNN's attention (rope+cuDNN,
  normrope+cuDNN), per variant and N, and the issue's 1.0 target.
Only rows that passed their correctness check are drawn. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def bars(ax, groups: list[str], series: dict[str, list[float]], title: str) -> None:
    """Grouped bars: one group per label in `groups`, one bar per series."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)


def plot_ab(rows: list[dict], out: Path) -> None:
    import matplotlib.pyplot as plt

    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        mine = [r for r in rows if r["shape"] == shape and r["ok"]]
        groups = [f"{r['variant']} {r['n']}" for r in mine]
        old = any("reduce" in r["ms"] for r in mine)  # before dQ by reduce-adds was the default
        forms = (
            {"gluon": "the ordered kernel", "reduce": "reduce-adds"}
            if old
            else {"gluon": "reduce-adds (default)", "ordered": "the ordered kernel"}
        )
        forms |= {key: key for key in mine[0]["ms"] if key not in forms and key != "generic"} if mine else {}
        series = {
            f"Gluon, dQ by {name}" if key in ("gluon", "reduce", "ordered") else f"Gluon, {name}": [
                r["ms"]["generic"] / r["ms"][key] for r in mine
            ]
            for key, name in forms.items()
            if all(key in r["ms"] for r in mine)
        }
        bars(ax, groups, series, f"{shape}: generic backward ms / Gluon backward ms")
    fig.suptitle("backward_ab.json (GPU and versions: backward_ab.md)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plot_vs_cudnn(data: dict, out: Path) -> None:
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r.get("ok")]
    ours = [r for r in rows if r["impl"] == "attnfuse"]
    shapes = sorted({r["shape"] for r in ours})
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        groups, fwdbwd, bwd = [], [], []
        for r in (x for x in ours if x["shape"] == shape):
            peer = next(
                (
                    p
                    for p in rows
                    if p["shape"] == shape and p["variant"] == r["variant"] and p["n"] == r["n"]
                    and p["impl"].endswith("sdpa_cudnn")
                ),
                None,
            )  # fmt: skip
            if peer is None:
                continue
            groups.append(f"{r['variant']} {r['n']}")
            fwdbwd.append(peer["fwdbwd_ms"] / r["fwdbwd_ms"])
            bwd.append(peer["bwd_ms"] / r["bwd_ms"])
        series = {"fwd+bwd": fwdbwd, "backward alone": bwd}
        bars(ax, groups, series, f"{shape}: (rope+)cuDNN ms / AttnFuse ms")
    env = data.get("environment", {})
    title = f"{env.get('gpu', '')}, {env.get('date_utc', '')}, torch {env.get('torch', '')}"
    fig.suptitle(f"{title}, triton {env.get('triton', '')}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    ab = args.results / "backward_ab.json"
    if ab.exists():
        plot_ab(json.loads(ab.read_text()), args.results / "backward_ab.png")
    quick = args.results / "backward_quick.json"
    quick = quick if quick.exists() else args.results / "backward.json"
    if quick.exists():
        plot_vs_cudnn(json.loads(quick.read_text()), args.results / "backward_vs_cudnn.png")


if __name__ == "__main__":
    main()
