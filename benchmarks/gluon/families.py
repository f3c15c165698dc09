"""The sm90 Gluon kernel against the generic Triton kernel, per variant family, at the Llama-3-8B
attention shape (B 1, Hq 32, Hkv 8, D 128, bf16): the same variant compiled twice by the
compiler (kernel-path's choice, and `gluon=false`), both launched through their generated
`launch`, timed as do_bench medians in one process. Each pair of outputs is compared (the
two kernels are independent lowerings of one variant); correctness against the reference is
test_gpu_gluon.py's.

    python benchmarks/gluon/families.py --out DIR [--ns 4096,8192,16384]

Writes DIR/families.json and DIR/families.md. Needs an sm90 GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common as C  # noqa: E402
import torch  # noqa: E402

from attnfuse.cache import load_source  # noqa: E402
from attnfuse.compiler import compile_module  # noqa: E402
from attnfuse.ir import parse_module  # noqa: E402

HQ, HKV, D = 32, 8, 128
T = f"tensor<?x{HQ}x?x{D}xbf16>"
TK = f"tensor<?x{HKV}x?x{D}xbf16>"
ROPE = "attn.rope %{x} half theta = 500000.0 rotary_dim = 128 : {t}"

# 4 tanh(x / 4) + h / 32: a score_mod with a transcendental op (a softcap written by hand).
SCORE_MOD_TANH = """attn.score_mod {s} {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.constant 0.25 : f32
    %y = arith.mulf %x, %c : f32
    %t = math.tanh %y : f32
    %four = arith.constant 4.0 : f32
    %z = arith.mulf %t, %four : f32
    attn.yield %z : f32
  }"""
# x + (kv - q) / 1024: a cheap, position-dependent score_mod.
SCORE_MOD_LINEAR = """attn.score_mod {s} {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %d = arith.subi %ki, %qi : i32
    %df = arith.sitofp %d : i32 to f32
    %c = arith.constant 0.0009765625 : f32
    %y = arith.mulf %df, %c : f32
    %z = arith.addf %x, %y : f32
    attn.yield %z : f32
  }"""

# name -> (score ops, each `%out = op %in ...`; softmax suffix; extra arguments; q/k RoPE)
FAMILIES: dict[str, tuple[list[str], str, list[str], bool]] = {
    "causal": (["attn.mask {s} causal"], "", [], False),
    "rope_causal": (["attn.mask {s} causal"], "", [], True),
    "sliding_window_4096": (["attn.mask {s} sliding_window(4096)"], "", [], True),
    "softcap_causal": (["attn.softcap {s} cap = 50.0", "attn.mask {s} causal"], "", [], False),
    "gemma2_rope_softcap_window": (
        ["attn.softcap {s} cap = 50.0", "attn.mask {s} sliding_window(4096)"],
        "",
        [],
        True,
    ),
    "alibi_causal": ([f"attn.bias {{s}} alibi(%sl : tensor<{HQ}xf32>)", "attn.mask {s} causal"], "", ["sl"], False),
    "sink_causal": (["attn.mask {s} causal"], f"sink(%sk : tensor<{HQ}xf32>)", ["sk"], False),
    "gpt_oss_rope_window128_sink": (
        ["attn.mask {s} sliding_window(128)"],
        f"sink(%sk : tensor<{HQ}xf32>)",
        ["sk"],
        True,
    ),
    "score_mod_tanh_causal": ([SCORE_MOD_TANH, "attn.mask {s} causal"], "", [], False),
    "score_mod_linear_causal": ([SCORE_MOD_LINEAR, "attn.mask {s} causal"], "", [], False),
    "prefix_lm_1024": (["attn.mask {s} prefix_lm(1024)"], "", [], False),
    "document_causal": (["attn.mask {s} causal", "attn.mask {s} document(%ids : tensor<?x?xi32>)"], "", ["ids"], False),
}
EXTRA_TYPES = {"sl": f"tensor<{HQ}xf32>", "sk": f"tensor<{HQ}xf32>", "ids": "tensor<?x?xi32>"}


def variant_ir(name: str) -> str:
    ops, softmax, extras, rope = FAMILIES[name]
    args = ", ".join([f"%q: {T}", f"%k: {TK}", f"%v: {TK}", *(f"%{e}: {EXTRA_TYPES[e]}" for e in extras)])
    lines, q, k = [], "%q", "%k"
    if rope:
        lines += [f"  %qr = {ROPE.format(x='q', t=T)}", f"  %kr = {ROPE.format(x='k', t=TK)}"]
        q, k = "%qr", "%kr"
    lines.append(f"  %s0 = attn.qk {q}, {k} : {T}, {TK} -> !attn.scores<{HQ}>")
    s = "%s0"
    for i, op in enumerate(ops, 1):
        lines.append(f"  %s{i} = {op.replace('{s}', s)} : !attn.scores<{HQ}>")
        s = f"%s{i}"
    lines.append(f"  %p = attn.softmax {s} {softmax} : !attn.scores<{HQ}> -> !attn.probs<{HQ}>")
    lines.append(f"  %o = attn.pv %p, %v : !attn.probs<{HQ}>, {TK} -> {T}")
    body = "\n".join(lines)
    return f"func.func @f({args}) -> {T} {{\n{body}\n  func.return %o : {T}\n}}\n"


def inputs(name: str, n: int) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(n)
    xs = [torch.randn(1, h, n, D, device="cuda", dtype=torch.bfloat16, generator=g) for h in (HQ, HKV, HKV)]
    extra = {
        "sl": torch.tensor([2.0 ** -(8 * (i + 1) / HQ) for i in range(HQ)], device="cuda"),
        "sk": torch.randn(HQ, device="cuda", generator=g),
        "ids": (torch.arange(n, device="cuda") * 4 // n).int()[None],  # four documents
    }
    return xs + [extra[e] for e in FAMILIES[name][2]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ns", default="4096,8192,16384")
    ap.add_argument("--families", default=",".join(FAMILIES))
    args = ap.parse_args()
    if not torch.cuda.is_available() or C.device_sm() != 90:
        raise SystemExit("families.py needs an sm90 GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    env, rows = C.environment(), []
    for name in args.families.split(","):
        ir = variant_ir(name)
        for n in (int(x) for x in args.ns.split(",")):
            kernels = {}
            for impl, gluon in (("gluon", True), ("generic", False)):
                source = compile_module(parse_module(ir), sm=90, seq_len=n, gluon=gluon).source
                if gluon and "_gluon_attention(" not in source:
                    raise SystemExit(f"{name}: kernel-path did not choose the Gluon kernel")
                kernels[impl] = load_source(source, C.source_dir(), interpret=False)
            xs = inputs(name, n)
            outs = {impl: k.launch(*xs)[0] for impl, k in kernels.items()}
            diff = (outs["gluon"].float() - outs["generic"].float()).abs().max().item()
            ms = {impl: C.bench(lambda k=k, xs=xs: k.launch(*xs)) for impl, k in kernels.items()}
            row = {"family": name, "n": n, "gluon_ms": ms["gluon"], "generic_ms": ms["generic"]}
            row |= {"speedup": ms["generic"] / ms["gluon"], "max_abs_diff": diff}
            rows.append(row)
            C.log(
                f"{name:30s} N={n:6d} gluon {ms['gluon']:.3f} ms generic {ms['generic']:.3f} ms "
                f"x{row['speedup']:.2f} diff {diff:.1e}"
            )
            C.write_json(args.out / "families.json", {"environment": env, "rows": rows})
    lines = [
        C.env_markdown(env),
        "",
        "| family | N | Gluon ms | generic ms | generic / Gluon | max |diff| |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['family']} | {r['n']} | {r['gluon_ms']:.3f} | {r['generic_ms']:.3f} | {r['speedup']:.2f} | "
        f"{r['max_abs_diff']:.1e} |"
        for r in rows
    ]
    (args.out / "families.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
