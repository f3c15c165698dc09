"""Forward attention on the GPU: AttnFuse against flex_attention, a separate RoPE + flex,
and SDPA's flash and cuDNN backends (with and without a separate RoPE), per variant,
shape and sequence length.

    python benchmarks/bench_forward.py --out DIR [--quick] [--budget-s 450]
    python benchmarks/bench_forward.py --out DIR --cpu-smoke     # no GPU: interpreter, tiny shapes

Implementations (JSON key `impl`):

- `attnfuse`: the generated kernel(s) with the pipeline's own choices for this N: on sm90
  the Gluon kernel where kernel-path takes the variant, and rope-fusion's `auto` mode;
  `attnfuse_generic`: the generic Triton kernel (`gluon=false`), the baseline of the Gluon
  path; `attnfuse_fused` / `attnfuse_prerotate`: each rope-fusion mode forced on the generic
  kernel (variants with pre-matmul transforms only). A build whose source equals another's
  is not re-timed.
- `flex`: `torch.compile`d `flex_attention` with a BlockMask (causal or window) and a
  score_mod for softcap / ALiBi; GQA through `enable_gqa`. For a variant with RoPE or
  QK-norm it computes the variant *without* them (the `core`), as in anchors.md.
- `rope+flex`: the variant's pre-matmul transforms (RoPE, and QK-norm where the variant
  has it) by a separate function compiled per shape (`torch.compile(dynamic=False)`: the
  default recompiles a dynamic kernel several times slower), then `flex`. The RoPE alone is
  timed too (`rope_only`, with its bandwidth: q and k read and written once).
- `sdpa_flash`, `sdpa_cudnn` (and `rope+sdpa_...`): `scaled_dot_product_attention`
  under `sdpa_kernel(<backend>)` with `is_causal=True`; only for variants whose score
  part is plain causal. GQA through `enable_gqa=True`, or, where the backend refuses
  that, k/v expanded with repeat_interleave (noted in the row).
- `hf_rope+sdpa_cudnn`: what a stock Hugging Face Llama runs (RoPE variants without QK-norm):
  its eager `apply_rotary_pos_emb` (q * cos + rotate_half(q) * sin in the model's dtype,
  cos/sin full-width), then SDPA cuDNN.

Every output is first compared with the float32 formula of `common.reference_formula`
(|out - ref| <= 2e-2 + 2e-2 |ref|); a failing row is marked WRONG and its time is not
reported as valid (it is kept under `ms_unchecked`). Times are `do_bench` medians in
one process; FLOPs 4 B Hq D per kept (query, key) pair (N^2 / 2 pairs for causal).

Results: DIR/forward.json (all rows + environment, rewritten after every case),
DIR/forward.md (tables per shape and variant).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings
from collections.abc import Callable
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
import torch.nn.functional as F  # noqa: E402

QUICK_NS = (1024, 4096, 16384)
QUICK_VARIANTS = ("causal", "rope_causal")
# Most important first: when the time budget runs out, what is left is the least needed.
PRIORITY = ("rope_causal", "causal", "qknorm_rope", "softcap", "alibi", "sliding_window", "softcap_window")
SMOKE_NS = (80,)
SMOKE_WINDOW = 32


# ----------------------------------------------------------------------------- peers


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _softcap(score, b, h, q_idx, kv_idx):
    return C.SOFTCAP * torch.tanh(score / C.SOFTCAP)


class Peers:
    """The compiled peer functions, built once so that torch.compile's guards see the
    same Python objects for every case (each new N is one recompile, not more)."""

    def __init__(self, device: str, compiled: bool, flex_dynamic: bool | None, window: int):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.device = device
        self.window = window
        self.create_block_mask = create_block_mask
        if compiled:
            C.raise_recompile_limits()
            self.flex = torch.compile(flex_attention, dynamic=flex_dynamic)
            # Static shapes: after its first shapes the default (dynamic=None) recompiles one
            # dynamic kernel that runs ~4x slower; the peers get their best configuration.
            self.pre_rope = torch.compile(_pre_rope, dynamic=False)
            self.pre_norm_rope = torch.compile(_pre_norm_rope, dynamic=False)
        else:  # --cpu-smoke: eager (the formulas are the same functions), unfused on purpose
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            self.flex, self.pre_rope, self.pre_norm_rope = flex_attention, _pre_rope, _pre_norm_rope
        win = window

        def sliding(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < win)

        self.sliding = sliding
        self._alibi: dict[int, Callable] = {}
        self._masks: dict[tuple[str, int], Any] = {}
        self._tables: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def alibi(self, q_heads: int) -> Callable:
        if q_heads not in self._alibi:
            slopes = C.alibi_slopes(q_heads).to(self.device)

            def alibi(score, b, h, q_idx, kv_idx):
                return score + slopes[h] * (kv_idx - q_idx).to(torch.float32)

            self._alibi[q_heads] = alibi
        return self._alibi[q_heads]

    def block_mask(self, kind: str, n: int) -> Any:
        if (kind, n) not in self._masks:
            fn = _causal if kind == "causal" else self.sliding
            self._masks[(kind, n)] = self.create_block_mask(fn, None, None, n, n, device=self.device)
        return self._masks[(kind, n)]

    def tables(self, n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        if (n, d) not in self._tables:
            self._tables[(n, d)] = C.rope_tables(n, d, self.device)
        return self._tables[(n, d)]

    def pre(self, variant: C.BenchVariant, inputs: C.Inputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """A function applying the variant's pre-matmul transforms to q and k."""
        q, k = inputs.q, inputs.k
        cos, sin = self.tables(q.shape[2], q.shape[3])
        if variant.qknorm:
            wq, wk = inputs.extras[0], inputs.extras[1]
            return lambda: self.pre_norm_rope(q, k, wq, wk, cos, sin)
        return lambda: self.pre_rope(q, k, cos, sin)

    def hf_pre(self, inputs: C.Inputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """The eager RoPE of a stock Hugging Face model, on q and k."""
        q, k = inputs.q, inputs.k
        cos, sin = self.tables(q.shape[2], q.shape[3])
        cos2, sin2 = torch.cat((cos, cos), -1).to(q.dtype), torch.cat((sin, sin), -1).to(q.dtype)
        return lambda: _hf_rope(q, k, cos2, sin2)

    def flex_call(self, variant: C.BenchVariant, shape: C.Shape, n: int) -> Callable:
        """(q, k, v) -> out of the variant's score part through flex_attention."""
        score_mod = None
        if variant.softcap is not None:
            score_mod = _softcap
        elif variant.alibi:
            score_mod = self.alibi(shape.q_heads)
        bm = self.block_mask(variant.mask, n)
        flex, gqa = self.flex, shape.gqa
        return lambda q, k, v: flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=gqa)


def _pre_rope(q, k, cos, sin):
    return C.rope_half(q.float(), cos, sin).to(q.dtype), C.rope_half(k.float(), cos, sin).to(k.dtype)


def _hf_rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _hf_rope(q, k, cos, sin):
    """Hugging Face's eager apply_rotary_pos_emb (transformers' Llama), cos/sin [N, D] in q's dtype."""
    return q * cos + _hf_rotate_half(q) * sin, k * cos + _hf_rotate_half(k) * sin


def _pre_norm_rope(q, k, wq, wk, cos, sin):
    q2 = C.rope_half(C.rms_norm(q, wq), cos, sin).to(q.dtype)
    k2 = C.rope_half(C.rms_norm(k, wk), cos, sin).to(k.dtype)
    return q2, k2


# ----------------------------------------------------------------------------- one case


def attnfuse_modes(variant: C.BenchVariant) -> tuple[str, ...]:
    """AttnFuse builds measured: auto (the pipeline's own choices: on sm90 the Gluon kernel
    where kernel-path takes the variant), generic (the generic Triton kernel, gluon=false),
    plus both forced rope-fusion modes of the generic kernel when there is a K transform."""
    return ("auto", "generic", "fused", "prerotate") if variant.has_pre else ("auto", "generic")


class Runner:
    """Runs and records the implementations of one (variant, shape, N) case."""

    def __init__(self, args: argparse.Namespace, peers: Peers, sm: int):
        self.args = args
        self.peers = peers
        self.sm = sm
        self.interpret = args.cpu_smoke
        self.rows: list[dict[str, Any]] = []
        self.built: dict[C.KernelJob, C.Built] = {}

    def measure(
        self,
        base: dict[str, Any],
        impl: str,
        fn: Callable[[], Any],
        ref: torch.Tensor,
        flops: float,
        *,
        computes: str,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Check fn()'s output against `ref`, then time it; one JSON row (errors caught)."""
        row = {**base, "impl": impl, "computes": computes, **(extra or {})}
        t0 = time.time()
        try:
            out = fn()
            if isinstance(out, tuple):
                out = out[0]
            C.synchronize()
            row["first_call_s"] = round(time.time() - t0, 3)
            check = C.compare(out, ref, self.args.atol, self.args.rtol)
            row.update(check.as_dict())
            del out
            ms = C.bench(fn, warmup=self.args.warmup, rep=self.args.rep)
            if check.ok:
                row["ms"] = ms
                row["tflops"] = C.tflops(flops, ms)
            else:
                row["ms"] = None
                row["ms_unchecked"] = ms
                row["status"] = "WRONG"
        except Exception as e:  # noqa: BLE001 - one failing implementation must not stop the run
            row.update(ok=False, ms=None, status="ERROR", error=f"{type(e).__name__}: {e}"[:2000])
            C.log(f"    {impl}: {row['error'].splitlines()[0][:300]}")
            if self.args.verbose:
                traceback.print_exc()
        row.setdefault("status", "ok")
        row["wall_s"] = round(time.time() - t0, 2)
        if row.get("ms") is not None or row["status"] != "ok":
            ms_txt = C.fmt(row.get("ms") or row.get("ms_unchecked"))
            C.log(
                f"    {impl:22s} {row['status']:6s} {ms_txt:>9s} ms  "
                f"{C.fmt(row.get('tflops'), 1):>7s} TFLOP/s  max_abs={row.get('max_abs', float('nan')):.2e}  "
                f"({row['wall_s']:.1f}s)"
            )
        self.rows.append(row)
        return row

    def job(self, variant: C.BenchVariant, shape: C.Shape, n: int, mode: str) -> C.KernelJob:
        if mode == "auto":
            options: dict[str, Any] = {"rope_mode": "auto"}
            if self.args.gluon_head_dims:
                options["gluon_head_dims"] = tuple(int(x) for x in self.args.gluon_head_dims.split(","))
            if self.args.gluon_min_len:
                options["gluon_min_len"] = options["gluon_min_len_transformed"] = self.args.gluon_min_len
            return C.KernelJob.make(variant.name, shape, n, self.sm, self.args.window, **options)
        rope_mode = "auto" if mode == "generic" else mode
        return C.KernelJob.make(variant.name, shape, n, self.sm, self.args.window, rope_mode=rope_mode, gluon=False)

    def attnfuse(
        self,
        variant: C.BenchVariant,
        shape: C.Shape,
        n: int,
        inputs: C.Inputs,
        ref: torch.Tensor,
        base: dict[str, Any],
        flops: float,
    ) -> None:
        """Rows for AttnFuse: the auto mode and, with pre-matmul transforms, each forced
        rope-fusion mode (a mode whose source equals an earlier one's reuses its row)."""
        sources: dict[str, str] = {}
        measured: dict[str, dict[str, Any]] = {}
        for mode in attnfuse_modes(variant):
            impl = "attnfuse" if mode == "auto" else f"attnfuse_{mode}"
            job = self.job(variant, shape, n, mode)
            built = self.built.get(job) or C.build(job)
            if built.source is None:
                self.rows.append(
                    {
                        **base,
                        "impl": impl,
                        "mode": mode,
                        "computes": "full",
                        "ok": False,
                        "ms": None,
                        "status": "ERROR",
                        "error": built.error,
                    }
                )
                C.log(f"    {impl}: {built.error}")
                continue
            sources[mode] = built.source
            same = next((m for m in measured if sources[m] == built.source), None)
            if same is not None:
                row = {**measured[same], "impl": impl, "mode": mode, "same_source_as": same}
                row.pop("auto_choice", None)
                self.rows.append(row)
                measured[mode] = row
                continue
            extra = {"mode": mode, "launch_params": built.launch_params}
            if built.error:
                extra["warm_up_error"] = built.error
            try:
                kern = C.load_source(built.source, interpret=self.interpret)
            except Exception as e:  # noqa: BLE001
                self.rows.append(
                    {
                        **base,
                        "impl": impl,
                        "computes": "full",
                        "ok": False,
                        "ms": None,
                        "status": "ERROR",
                        "error": f"load: {type(e).__name__}: {e}"[:2000],
                        **extra,
                    }
                )
                continue
            measured[mode] = self.measure(
                base, impl, lambda kern=kern, a=inputs.args: kern.launch(*a), ref, flops, computes="full", extra=extra
            )
        if "auto" in measured:
            if "_gluon_attention(" in sources["auto"]:
                measured["auto"]["auto_choice"] = "gluon"
            elif variant.has_pre:
                choice = next((m for m in ("fused", "prerotate") if sources.get(m) == sources["auto"]), "other")
                measured["auto"]["auto_choice"] = choice

    def peers_rows(
        self,
        variant: C.BenchVariant,
        shape: C.Shape,
        n: int,
        inputs: C.Inputs,
        ref: torch.Tensor,
        ref_core: torch.Tensor | None,
        base: dict[str, Any],
        flops: float,
    ) -> None:
        p = self.peers
        q, k, v = inputs.q, inputs.k, inputs.v
        core_ref = ref_core if variant.has_pre else ref
        self.flex_rows(variant, p.flex_call(variant, shape, n), inputs, ref, core_ref, base, flops)
        if not variant.sdpa_expressible:
            return
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = (
            {"sdpa_math": SDPBackend.MATH}
            if self.interpret
            else {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
        )
        group = shape.q_heads // shape.kv_heads
        for name, backend in backends.items():
            with sdpa_kernel([backend]):
                gqa_note = self._sdpa_gqa_mode(shape, q, k, v)
                if gqa_note == "enable_gqa" or not shape.gqa:

                    def attn(q2, k2):
                        return F.scaled_dot_product_attention(q2, k2, v, is_causal=True, enable_gqa=shape.gqa)
                else:

                    def attn(q2, k2):
                        k3 = k2.repeat_interleave(group, dim=1)
                        v3 = v.repeat_interleave(group, dim=1)
                        return F.scaled_dot_product_attention(q2, k3, v3, is_causal=True)

                extra = {"gqa": gqa_note} if shape.gqa else None
                self.measure(
                    base,
                    name,
                    lambda attn=attn: attn(q, k),
                    core_ref,
                    flops,
                    computes="core" if variant.has_pre else "full",
                    extra=extra,
                )
                if variant.has_pre:
                    pre = p.pre(variant, inputs)

                    def rope_sdpa(attn=attn, pre=pre):
                        q2, k2 = pre()
                        return attn(q2, k2)

                    self.measure(base, "rope+" + name, rope_sdpa, ref, flops, computes="full", extra=extra)
                if name in ("sdpa_cudnn", "sdpa_math") and variant.rope and not variant.qknorm:
                    self.hf_row(base, name, attn, inputs, ref, flops, extra)

    def flex_rows(self, variant, flex, inputs, ref, core_ref, base, flops) -> None:
        """flex_attention, and for a variant with pre-matmul transforms the compiled separate
        transform then flex, and that transform alone."""
        q, k, v = inputs.q, inputs.k, inputs.v
        computes = "core" if variant.has_pre else "full"
        self.measure(base, "flex", lambda: flex(q, k, v), core_ref, flops, computes=computes)
        if variant.has_pre:
            pre = self.peers.pre(variant, inputs)

            def rope_flex():
                q2, k2 = pre()
                return flex(q2, k2, v)

            self.measure(base, "rope+flex", rope_flex, ref, flops, computes="full")
            self.rope_only(base, pre, inputs)

    def hf_row(self, base, name, attn, inputs, ref, flops, extra) -> None:
        """A stock Hugging Face model's eager RoPE, then the SDPA backend `name`."""
        hf = self.peers.hf_pre(inputs)

        def hf_sdpa():
            q2, k2 = hf()
            return attn(q2, k2)

        self.measure(base, "hf_rope+" + name, hf_sdpa, ref, flops, computes="full", extra=extra)

    def rope_only(self, base: dict[str, Any], pre: Callable[[], Any], inputs: C.Inputs) -> None:
        """Time the peers' separate pre-transform alone and record its bandwidth (TB/s: q and k
        read once and written once)."""
        row = {**base, "impl": "rope_only", "computes": "pre", "status": "ok"}
        try:
            pre()
            ms = C.bench(pre, warmup=self.args.warmup, rep=self.args.rep)
            moved = 2 * sum(x.numel() * x.element_size() for x in (inputs.q, inputs.k))
            row.update(ms=ms, tb_s=moved / (ms * 1e-3) / 1e12)
            C.log(f"    {'rope_only':22s} ok     {C.fmt(ms):>9s} ms  {row['tb_s']:.2f} TB/s")
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            row.update(ms=None, status="ERROR", error=f"{type(e).__name__}: {e}"[:2000])
        self.rows.append(row)

    @staticmethod
    def _sdpa_gqa_mode(shape: C.Shape, q, k, v) -> str:
        """'enable_gqa' when the active backend takes it, else 'repeat_interleave'."""
        if not shape.gqa:
            return "none"
        try:
            F.scaled_dot_product_attention(q[:, :, :128], k[:, :, :128], v[:, :, :128], is_causal=True, enable_gqa=True)
            return "enable_gqa"
        except Exception:  # noqa: BLE001
            return "repeat_interleave"

    def case(self, variant: C.BenchVariant, shape: C.Shape, n: int, seed: int) -> None:
        window = self.args.window
        device = "cpu" if self.interpret else "cuda"
        base = {"shape": shape.name, "variant": variant.name, "n": n}
        inputs = C.make_inputs(variant, shape, n, device, seed)
        ref = C.reference_formula(variant, inputs, window=window)
        ref_core = None
        if variant.has_pre:
            core_inputs = C.Inputs(inputs.q, inputs.k, inputs.v, inputs.extras[2 if variant.qknorm else 0 :])
            ref_core = C.reference_formula(variant.core, core_inputs, window=window)
        if self.interpret:
            self.formula_vs_executor(variant, shape, inputs, ref, base)
        flops = C.attention_flops(variant, shape, n, n, window)
        self.attnfuse(variant, shape, n, inputs, ref, base, flops)
        self.peers_rows(variant, shape, n, inputs, ref, ref_core, base, flops)
        for row in self.rows:
            if row.get("n") == n and row.get("variant") == variant.name and row.get("shape") == shape.name:
                row.setdefault("flops", flops)

    def formula_vs_executor(
        self, variant: C.BenchVariant, shape: C.Shape, inputs: C.Inputs, ref: torch.Tensor, base: dict[str, Any]
    ) -> None:
        """--cpu-smoke: the float32 formula must agree with attnfuse.reference on the IR."""
        from attnfuse.reference import run_reference

        expected = run_reference(C.make_ir(variant, shape, self.args.window), *inputs.args)
        err = float((ref.double() - expected).abs().max())
        ok = err < 1e-4
        self.rows.append(
            {
                **base,
                "impl": "formula_vs_reference_executor",
                "ok": ok,
                "max_abs": err,
                "status": "ok" if ok else "WRONG",
                "ms": None,
            }
        )
        C.log(f"    formula vs reference executor: max_abs={err:.2e} {'ok' if ok else 'WRONG'}")


# ----------------------------------------------------------------------------- tables


PEER_COLUMNS = (
    "flex",
    "rope+flex",
    "sdpa_flash",
    "rope+sdpa_flash",
    "sdpa_cudnn",
    "rope+sdpa_cudnn",
    "hf_rope+sdpa_cudnn",
    "sdpa_math",
    "hf_rope+sdpa_math",
)
SPEEDUPS = (
    ("attnfuse_generic", "generic kernel"),
    ("rope+flex", "rope+flex"),
    ("rope+sdpa_cudnn", "rope+cuDNN"),
    ("hf_rope+sdpa_cudnn", "HF eager rope+cuDNN"),
    ("flex", "flex"),
    ("sdpa_cudnn", "cuDNN"),
)


def cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    if row.get("status") in ("WRONG", "ERROR"):
        return row["status"]
    if row.get("tb_s") is not None:
        return f"{row['ms']:.3f} ({row['tb_s']:.2f} TB/s)"
    t = row.get("tflops")
    return f"{row['ms']:.3f} ({t:.0f})" if t is not None else f"{row['ms']:.3f}"


def markdown(rows: list[dict[str, Any]], env: dict[str, Any], args: argparse.Namespace, shapes: dict) -> str:
    out = [
        "# Forward attention: AttnFuse vs flex_attention and SDPA\n",
        C.env_markdown(env),
        f"\nCells: median ms (TFLOP/s). Speed-up = peer ms / AttnFuse (auto) ms; > 1: AttnFuse is faster. "
        f"`flex`/`sdpa_*` on a RoPE variant compute it without RoPE/QK-norm; `rope+X` adds a separate "
        f"pre-transform compiled per shape (`rope_only`: that pre-transform alone, with its bandwidth); "
        f"`hf_rope+sdpa_cudnn` is a stock Hugging Face model's eager RoPE then cuDNN. "
        f"Sliding window = {args.window}. WRONG: output failed the check against the float32 formula "
        f"(time not valid).\n",
    ]
    for shape in shapes.values():
        for vname in PRIORITY:
            sel = [r for r in rows if r.get("shape") == shape.name and r.get("variant") == vname]
            if not sel:
                continue
            ns = sorted({r["n"] for r in sel})
            impls = ["attnfuse", "attnfuse_generic", "attnfuse_fused", "attnfuse_prerotate", *PEER_COLUMNS, "rope_only"]
            present = [i for i in impls if any(r["impl"] == i for r in sel)]
            out.append(f"\n## {shape.name} ({shape.describe()}), {vname}\n")
            head = ["N", *present]
            speed = [(key, label) for key, label in SPEEDUPS if key in present]
            head += [f"× vs {label}" for _, label in speed]
            if any(r.get("auto_choice") for r in sel):
                head.append("auto chose")
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            for n in ns:
                by = {r["impl"]: r for r in sel if r["n"] == n}
                cells = [str(n)] + [cell(by.get(i)) for i in present]
                ours = by.get("attnfuse", {}).get("ms")
                for key, _ in speed:
                    theirs = by.get(key, {}).get("ms")
                    cells.append(f"{theirs / ours:.2f}" if ours and theirs else "—")
                if "auto chose" in head:
                    cells.append(str(by.get("attnfuse", {}).get("auto_choice") or "—"))
                out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path, help="folder for forward.json and forward.md")
    ap.add_argument("--quick", action="store_true", help=f"N in {QUICK_NS}, variants {QUICK_VARIANTS}")
    ap.add_argument("--variants", default=None, help=f"comma-separated subset of {','.join(C.VARIANTS)}")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of paper,llama,gemma2 (default paper,llama)")
    ap.add_argument(
        "--gluon-head-dims",
        default=None,
        help="kernel-path's head-dims for the auto build, e.g. 64,128,256 (default: the pipeline's own)",
    )
    ap.add_argument(
        "--gluon-min-len",
        type=int,
        default=None,
        help="kernel-path's min-len and min-len-transformed for the auto build (default: the pipeline's own)",
    )
    ap.add_argument("--ns", default=None, help="comma-separated sequence lengths")
    ap.add_argument("--skip", default="", help="comma-separated shape:N cases to leave out, e.g. paper:16384")
    ap.add_argument("--window", type=int, default=None, help=f"sliding window (default {C.WINDOW})")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="stop starting new cases after this many seconds (results so far are written)",
    )
    ap.add_argument(
        "--flex-dynamic",
        action="store_true",
        help="compile flex with dynamic=True (one compile for all N) instead of static shapes",
    )
    C.add_measurement_args(ap)
    args = ap.parse_args(argv)
    if args.window is None:
        args.window = SMOKE_WINDOW if args.cpu_smoke else C.WINDOW
    return args


def selection(args: argparse.Namespace) -> tuple[list[C.BenchVariant], dict[str, C.Shape], list[int]]:
    def pick(text: str | None, default: tuple, known: dict | None, what: str) -> list:
        names = default if text is None else tuple(x.strip() for x in text.split(",") if x.strip())
        if known is not None:
            bad = [x for x in names if x not in known]
            if bad:
                raise SystemExit(f"unknown {what} {', '.join(bad)}; expected some of {', '.join(known)}")
        return list(names)

    vnames = pick(args.variants, QUICK_VARIANTS if args.quick else PRIORITY, C.VARIANTS, "variant")
    vnames = [v for v in PRIORITY if v in vnames]
    all_shapes = C.SMOKE_SHAPES if args.cpu_smoke else C.SHAPES
    snames = pick(args.shapes, C.DEFAULT_SHAPES, all_shapes, "shape")
    default_ns = SMOKE_NS if args.cpu_smoke else QUICK_NS if args.quick else C.SEQ_LENS
    ns = [int(x) for x in pick(args.ns, tuple(map(str, default_ns)), None, "N")]
    return [C.VARIANTS[v] for v in vnames], {s: all_shapes[s] for s in snames}, ns


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("bench_forward needs a CUDA GPU (or --cpu-smoke)")
    t_start = time.time()
    variants, shapes, ns = selection(args)
    skip = {tuple(x.split(":")) for x in args.skip.split(",") if x}
    cases = [(v, s, n) for v in variants for s in shapes.values() for n in ns if (s.name, str(n)) not in skip]
    sm = 0 if args.cpu_smoke else C.device_sm()
    env = C.environment()
    C.log(
        f"bench_forward: {len(cases)} cases, sm {sm}, {env.get('gpu', 'cpu')}, torch {env['torch']}, "
        f"triton {env['triton']}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.cpu_smoke else "cuda"
    peers = Peers(
        device, compiled=not args.cpu_smoke, flex_dynamic=True if args.flex_dynamic else False, window=args.window
    )
    runner = Runner(args, peers, sm)

    jobs = [runner.job(v, s, n, mode) for v, s, n in cases for mode in attnfuse_modes(v)]
    runner.built = C.build_all(jobs, 0 if args.cpu_smoke else args.workers, timeout_s=max(60.0, args.budget_s / 3))

    json_path, md_path = args.out / "forward.json", args.out / "forward.md"
    skipped: list[str] = []
    for i, (v, s, n) in enumerate(cases, 1):
        elapsed = time.time() - t_start
        if elapsed > args.budget_s:
            skipped.append(f"{v.name}/{s.name}/{n}")
            continue
        C.log(f"[{i}/{len(cases)}] {v.name} {s.name} N={n}  (elapsed {elapsed:.0f}s)")
        t_case = time.time()
        try:
            runner.case(v, s, n, seed=1000 * i + n)
        except Exception as e:  # noqa: BLE001
            runner.rows.append(
                {
                    "shape": s.name,
                    "variant": v.name,
                    "n": n,
                    "impl": "case",
                    "status": "ERROR",
                    "ok": False,
                    "ms": None,
                    "error": f"{type(e).__name__}: {e}"[:2000],
                }
            )
            C.log(f"    case failed: {type(e).__name__}: {e}")
            if args.verbose:
                traceback.print_exc()
        C.log(f"    case took {time.time() - t_case:.1f}s")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        result = {
            "environment": env,
            "args": {k: str(x) for k, x in vars(args).items()},
            "elapsed_s": round(time.time() - t_start, 1),
            "skipped_for_budget": skipped,
            "rows": runner.rows,
        }
        C.write_json(json_path, result)
        md_path.write_text(markdown(runner.rows, env, args, shapes))
    result = {
        "environment": env,
        "args": {k: str(x) for k, x in vars(args).items()},
        "elapsed_s": round(time.time() - t_start, 1),
        "skipped_for_budget": skipped,
        "rows": runner.rows,
    }
    C.write_json(json_path, result)
    md_path.write_text(markdown(runner.rows, env, args, shapes))
    if skipped:
        C.log(f"budget of {args.budget_s:.0f}s reached: skipped {len(skipped)} cases: {', '.join(skipped)}")
    bad = [r for r in runner.rows if r.get("status") in ("WRONG", "ERROR")]
    C.log(
        f"bench_forward done in {time.time() - t_start:.0f}s: {len(runner.rows)} rows, {len(bad)} WRONG/ERROR; "
        f"wrote {json_path} and {md_path}"
    )
    for r in bad:
        err = (r.get("error") or "").splitlines()[0][:200] if r.get("error") else ""
        dev = f" max_abs={r['max_abs']:.2e}" if r.get("max_abs") is not None else ""
        C.log(f"  {r['status']}: {r['shape']}/{r['variant']}/N={r['n']}/{r['impl']} {err}{dev}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
