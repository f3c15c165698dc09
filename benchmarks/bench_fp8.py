"""Speed of the FP8 forward (issue 24): AttnFuse's e4m3 kernels against its own bf16 forward and
against the same transforms run as separate kernels, in one process.

    python benchmarks/bench_fp8.py --out DIR [--ns 4096 8192 16384 --block 128 --tiles 128,64,8,3 ...]
    python benchmarks/bench_fp8.py --out DIR --cpu-smoke

Llama-3-8B's attention shape (B 1, Hq 32, Hkv 8, D 128), causal, bf16 inputs and output. Rows per N:

- `bf16`: plain causal attention, AttnFuse's bf16 forward (the Gluon kernel on sm90);
- `bf16 RoPE`: RoPE then causal attention, AttnFuse's bf16 forward;
- `fp8`: q, k and v quantized to e4m3 per block of `--block` rows (`af.quantize_fp8`), the whole
  call: a quantization kernel per operand, then the attention kernel;
- `fp8 attention kernel alone`: that call's attention kernel (the sm90 Gluon kernel where
  kernel-path chose it), launched alone on the e4m3 tensors and scales the call made (the FP8
  kernel a user with pre-quantized inputs would run);
- `fp8, generic kernel (gluon=false)`: the `fp8` call with the generic FP8 kernel;
- `fp8 + RoPE + Hadamard (fused)`: q and k rotated by RoPE then a Hadamard rotation, then
  quantized, in the quantization kernels (and `fp8 + RoPE`, `fp8 + Hadamard`: one of the two);
- `separate: RoPE, Hadamard, fp8`: the same by separate kernels: RoPE compiled by torch.compile
  per shape (`dynamic=False`), the Hadamard rotation as a bf16 matmul, then the `fp8` call.

TFLOP/s count causal attention's 2 * 2 * B * Hq * N^2 * D / 2 FLOPs. With `--tiles`, the `fp8`
call is also timed with each tiling (BLOCK_M,BLOCK_N,num_warps,num_stages) through
`compile_module`, and with `--quantize-tiles` the fused call with each shape of its quantization
kernels (rows,warps). Each FP8 output's relative error against the bf16 forward's is recorded (it is
the quantization's, a few percent: not a correctness check, which the GPU tests do against the
reference executor). Writes DIR/fp8.json and DIR/fp8.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402
import torch  # noqa: E402

import attnfuse as af  # noqa: E402

SEED = 3
"""The Hadamard rotation's sign seed."""


def variants(block: int) -> dict[str, af.Variant]:
    def bf16(q, k, v):  # type: ignore[no-untyped-def]
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    def bf16_rope(q, k, v):  # type: ignore[no-untyped-def]
        return bf16(af.rope(q, theta=500000.0), af.rope(k, theta=500000.0), v)

    def fp8(q, k, v):  # type: ignore[no-untyped-def]
        q, k, v = (af.quantize_fp8(x, block=block) for x in (q, k, v))
        return af.pv(af.softmax(af.mask(af.qk(q, k), af.causal)), v)

    def fp8_fused(q, k, v):  # type: ignore[no-untyped-def]
        q, k = (af.hadamard(af.rope(x, theta=500000.0), seed=SEED) for x in (q, k))
        return fp8(q, k, v)

    def fp8_rope(q, k, v):  # type: ignore[no-untyped-def]
        return fp8(af.rope(q, theta=500000.0), af.rope(k, theta=500000.0), v)

    def fp8_hadamard(q, k, v):  # type: ignore[no-untyped-def]
        return fp8(af.hadamard(q, seed=SEED), af.hadamard(k, seed=SEED), v)

    fns = [bf16, bf16_rope, fp8, fp8_fused, fp8_rope, fp8_hadamard]
    return {fn.__name__: af.Variant(fn, name=fn.__name__) for fn in fns}


def separate(block: int, n: int, d: int, device: str) -> Any:
    """RoPE by torch.compile (per shape), the Hadamard rotation as a bf16 matmul, then `fp8`."""
    cos, sin = C.rope_tables(n, d, device, 500000.0)
    fp8 = variants(block)["fp8"]

    def rope(x: torch.Tensor) -> torch.Tensor:
        return C.rope_half(x.float(), cos, sin).to(x.dtype)

    rotate = torch.compile(rope, dynamic=False) if device == "cuda" else rope
    m: dict[torch.dtype, torch.Tensor] = {}

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h = m.get(q.dtype)
        if h is None:
            h = m[q.dtype] = af.hadamard_matrix(d, SEED, dtype=q.dtype, device=device)
        return fp8(rotate(q) @ h, rotate(k) @ h, v)

    return run


def kernel_alone(variant: af.Variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    """A call of `variant`'s attention kernel alone, on the e4m3 tensors and scales one whole call
    made (its launcher's last launch, generic or Gluon, recorded)."""
    kernel = variant.compile(q, k, v)
    module = kernel._loaded.module
    launches: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    names = [n for n in ("_launch", "_gluon_attention") if hasattr(module, n)]
    real = {n: getattr(module, n) for n in names}

    def recorder(fn: Any) -> Any:
        return lambda *a, **kw: (launches.append((fn, a, kw)), fn(*a, **kw))[1]

    for n in names:
        setattr(module, n, recorder(real[n]))
    try:
        kernel.launch(q, k, v)
    finally:
        for n in names:
            setattr(module, n, real[n])
    fn, args, kwargs = launches[-1]
    return lambda: fn(*args, **kwargs)


def tiled(
    variant: af.Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tiles: tuple[int, ...] = (),
    quantize: tuple[int, int] | None = None,
    gluon: bool = True,
) -> Any:
    """`variant`'s call compiled with the tiling `tiles` (BLOCK_M, BLOCK_N, warps, stages), and its
    quantization kernels with `quantize` (rows transformed at a time, warps; a probe: it sets
    `fp8_to_tl`'s constants while compiling)."""
    from attnfuse.compiler import compile_module
    from attnfuse.passes import fp8_to_tl

    options: dict[str, Any] = dict(zip(("block_m", "block_n", "num_warps", "num_stages"), tiles, strict=False))
    options["gluon"] = gluon
    sm = torch.cuda.get_device_capability()[0] * 10 if q.is_cuda else 0
    saved = fp8_to_tl.TILE_ROWS, fp8_to_tl.QUANTIZE_WARPS
    if quantize is not None:
        fp8_to_tl.TILE_ROWS, fp8_to_tl.QUANTIZE_WARPS = quantize
    try:
        compiled = compile_module(variant.ir_module(q, k, v), sm=sm, seq_len=q.shape[2], **options)
    finally:
        fp8_to_tl.TILE_ROWS, fp8_to_tl.QUANTIZE_WARPS = saved
    module = C.load_source(compiled.source, interpret=not q.is_cuda)
    return lambda: module.launch(q, k, v)[0]


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = "cpu" if args.cpu_smoke else "cuda"
    vs = variants(args.block)
    rows: list[dict[str, Any]] = []
    for n in args.ns:
        g = torch.Generator(device=device).manual_seed(n)
        dtype = torch.float16 if args.cpu_smoke else torch.bfloat16
        q = torch.randn(1, args.hq, n, args.d, generator=g, device=device, dtype=dtype)
        k, v = (torch.randn(1, args.hkv, n, args.d, generator=g, device=device, dtype=dtype) for _ in range(2))
        flops = 2 * 2 * args.hq * n * n * args.d / 2
        with torch.no_grad():
            ref = vs["bf16"](q, k, v)
            ref_rope = vs["bf16_rope"](q, k, v)
            sep = separate(args.block, n, args.d, device)

            def call(name: str, fn: Any = None, q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> Any:
                return fn or (lambda: vs[name](q, k, v))

            calls = {
                "bf16": (call("bf16"), None),
                "bf16 RoPE": (call("bf16_rope"), None),
                "fp8": (call("fp8"), ref),
                "fp8 attention kernel alone": (kernel_alone(vs["fp8"], q, k, v), None),
                "fp8, generic kernel (gluon=false)": (tiled(vs["fp8"], q, k, v, gluon=False), ref),
                "fp8 + RoPE (fused)": (call("fp8_rope"), ref_rope),
                "fp8 + Hadamard (fused)": (call("fp8_hadamard"), ref),
                "fp8 + RoPE + Hadamard (fused)": (call("fp8_fused"), ref_rope),
                "separate: RoPE, Hadamard, fp8": (call("", lambda q=q, k=k, v=v, sep=sep: sep(q, k, v)), ref_rope),
            }
            for tiles in args.tiles:
                calls[f"fp8, tiles {','.join(map(str, tiles))}"] = (tiled(vs["fp8"], q, k, v, tiles), ref)
            for rows_warps in args.quantize_tiles:
                fused = tiled(vs["fp8_fused"], q, k, v, quantize=rows_warps)
                calls[f"fp8 + RoPE + Hadamard (fused), quantization {rows_warps[0]} rows x {rows_warps[1]} warps"] = (
                    fused,
                    ref_rope,
                )
            for name, (fn, against) in calls.items():
                out = fn()
                C.synchronize()
                ms = C.bench(fn)
                row = {"n": n, "case": name, "ms": ms, "tflops": C.tflops(flops, ms)}
                if against is not None:
                    row["rel_err_vs_bf16"] = rel(out, against)
                rows.append(row)
                C.log(f"N {n} {name}: {ms:.4f} ms, {row['tflops']} TFLOP/s")
    return rows


def write_md(rows: list[dict[str, Any]], args: argparse.Namespace, env: dict[str, Any], out: Path) -> None:
    lines = [
        "# FP8 forward (issue 24)",
        "",
        C.env_markdown(env),
        "",
        f"B 1, Hq {args.hq}, Hkv {args.hkv}, D {args.d}, causal, bf16 in and out; FP8 scales per {args.block} rows. "
        "TFLOP/s count 2·2·B·Hq·N²·D/2. `rel err` is against the bf16 forward (quantization error, not a check).",
        "",
        "| N | case | ms | TFLOP/s | rel err vs bf16 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        err = f"{r['rel_err_vs_bf16']:.2e}" if "rel_err_vs_bf16" in r else ""
        lines.append(f"| {r['n']} | {r['case']} | {r['ms']:.4f} | {C.fmt(r['tflops'])} | {err} |")
    lines.append("")
    for n in args.ns:
        by = {r["case"]: r["ms"] for r in rows if r["n"] == n}
        lines.append(
            f"N {n}: fp8 / bf16 speed **{by['bf16'] / by['fp8']:.2f}x**; fused transforms over the FP8 kernel alone "
            f"**{by['fp8 + RoPE + Hadamard (fused)'] / by['fp8 attention kernel alone'] - 1:+.1%}**; fused vs "
            f"separate kernels **{by['separate: RoPE, Hadamard, fp8'] / by['fp8 + RoPE + Hadamard (fused)']:.2f}x**."
        )
    lines.append("")
    (out / "fp8.md").write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ns", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--block", type=int, default=128, help="rows per quantization block")
    ap.add_argument(
        "--tiles", type=lambda s: tuple(int(x) for x in s.split(",")), nargs="*", default=[],
        help="tilings of the fp8 call to time too: BLOCK_M,BLOCK_N,num_warps,num_stages",
    )  # fmt: skip
    ap.add_argument(
        "--quantize-tiles", type=lambda s: tuple(int(x) for x in s.split(",")), nargs="*", default=[],
        help="quantization kernels of the fused call to time too: rows,warps",
    )  # fmt: skip
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    if args.cpu_smoke:
        args.ns, args.hq, args.hkv, args.d, args.block = [64], 2, 1, 32, 32
        args.tiles, args.quantize_tiles = [(32, 32, 4, 1)], [(32, 4)]
    args.out.mkdir(parents=True, exist_ok=True)
    env = C.environment()
    with af.backend("interpret" if args.cpu_smoke else "triton"):
        rows = run(args)
    C.write_json(args.out / "fp8.json", {"environment": env, "args": vars(args) | {"out": str(args.out)},
                                         "rows": rows})  # fmt: skip
    write_md(rows, args, env, args.out)
    print((args.out / "fp8.md").read_text())


if __name__ == "__main__":
    main()
