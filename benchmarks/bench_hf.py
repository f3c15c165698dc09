"""Hugging Face models with AttnFuse attention (`attnfuse.integrations.transformers.apply`)
against the same model on PyTorch's attention backends, in one process.

    python benchmarks/bench_hf.py --out DIR [--parts train,loss,infer,fidelity,qwen] [--ns 4096,8192]
    python benchmarks/bench_hf.py --out DIR --cpu-smoke     # no GPU: tiny configs, interpreter

- `train`: one training step of Llama-3-8B (the released config, random weights, bf16, fused
  AdamW, batch 1, no activation checkpointing) at each N: forward with labels, backward,
  optimizer step. Median step time over 5 steps after 2 warm-up steps, and the peak memory,
  for SDPA cuDNN (the stock model; with Liger-Kernel's fused RoPE, `sdpa_cudnn+liger_rope`, what
  `apply_liger_kernel_to_llama(rope=True)` patches in, nothing else of Liger's; with the model's
  own RoPE compiled per shape, `sdpa_cudnn+compiled_rope`), SDPA flash, flex_attention
  (transformers' "flex_attention", compiled afresh for each N with static shapes: `static_flex`)
  and AttnFuse (the model patched by `apply`), all on the same weights; the first step's loss is
  compared across them (use_cache=False: no KV cache is filled in training). A peer whose
  package is missing (liger-kernel) is a row with its error.
- `qwen`: the same step for Qwen3-8B (QK-norm fused too) at the first N, against SDPA cuDNN and
  its RoPE peers.
- `infer`: `generate()` of Llama-3-8B bf16, greedy, prompt lengths 1024 and 8192 (`--prompts`),
  with the dynamic cache, the static cache uncompiled (`disable_compile`) and the static cache
  as generate() compiles it (`static+compile`: torch.compile with transformers' default
  CompileConfig, CUDA graphs, for the decoding steps; `--caches`): prefill (time to the first new
  token, the better of 2 runs) and decode tokens/s over 64 new tokens (the median of 3 runs'
  total time, less the prefill), AttnFuse against SDPA (the
  default backend choice) in the same configuration, and how many new tokens agree before the
  first that differs (random weights give near-ties, so bf16 rounding may flip a greedy choice).
  `dynamic+compile`: the dynamic cache with the model's forward compiled by the caller
  (`torch.compile(model.forward, dynamic=True)`; generate() compiles only static caches).
  Each configuration runs once untimed first (compilation, CUDA-graph capture).
- `fidelity`: teacher forcing at prompt lengths 1024 and 8192: SDPA's greedy continuation (32
  tokens) fed one token at a time through each implementation with its own KV cache; per step,
  the relative L2 difference of the next-token logits against SDPA's default backend, whether the
  top token agrees, and SDPA's top-1 minus top-2 logit margin where it does not; SDPA forced to
  its flash backend is the bf16 noise floor.
- `loss`: 200 training steps of a small Llama-style model (float32 weights, bfloat16 autocast,
  AdamW) on fixed synthetic data, AttnFuse against SDPA from the same initial weights: the two
  loss curves (loss.json, loss.png).

Writes DIR/hf.json (rows and environment) and DIR/hf.md; with `--profile`, one more training step
per row under torch.profiler: DIR/profile_<model>_<N>_<impl>.txt, its kernels by their own time.
Each training row also has the GPU's median SM clock and mean power over its timed steps
(`nvidia-smi`, sampled every 50 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--cpu-smoke" in sys.argv:
    import os

    os.environ["TRITON_INTERPRET"] = "1"

import common as C  # noqa: E402
import torch  # noqa: E402

import attnfuse as af  # noqa: E402

LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
QWEN3_8B = dict(
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)
SMALL = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    vocab_size=4096,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
TINY = dict(SMALL, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=64)  # fmt: skip


def make_model(kind: str, cfg: dict[str, Any], impl: str, dtype: torch.dtype, device: str) -> Any:
    import transformers

    config_cls = transformers.LlamaConfig if kind == "llama" else transformers.Qwen3Config
    config = config_cls(**cfg)
    config._attn_implementation = impl
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.train()


ROPE_PEERS = ("liger_rope", "compiled_rope")
"""What a peer row's name may add after `+`: the RoPE it runs instead of the model's eager one."""


@contextlib.contextmanager
def rope_peer(name: str) -> Any:
    """For a row `<backend>+liger_rope` or `<backend>+compiled_rope`, the Llama and Qwen3 modules'
    `apply_rotary_pos_emb` replaced by Liger-Kernel's fused RoPE (as
    `apply_liger_kernel_to_llama(rope=True)` / `_to_qwen3(rope=True)` do) or by the model's own
    compiled for static shapes (dynamo reset first, so each N gets its own kernel); restored after.
    Other rows: unchanged."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3

    modules = (modeling_llama, modeling_qwen3)
    saved = [m.apply_rotary_pos_emb for m in modules]
    peer = name.partition("+")[2]
    if peer == "liger_rope":
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        new = [liger_rotary_pos_emb] * len(modules)
    elif peer == "compiled_rope":
        torch._dynamo.reset()
        new = [torch.compile(f, dynamic=False) for f in saved]
    elif peer:
        raise ValueError(f"unknown peer '{peer}' in row {name!r}: expected one of {ROPE_PEERS}")
    else:
        new = saved
    for m, f in zip(modules, new, strict=True):
        m.apply_rotary_pos_emb = f
    try:
        yield
    finally:
        for m, f in zip(modules, saved, strict=True):
            m.apply_rotary_pos_emb = f


def backend_context(name: str) -> Any:
    """The SDPA backend a row runs under (a no-op for the others)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    name = name.partition("+")[0]
    backends = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}
    if name in backends:
        return sdpa_kernel(backends[name])
    if name == "sdpa_math":
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def static_flex() -> None:
    """Compile flex_attention afresh, for static shapes, before a flex row at a new N.

    transformers compiles flex_attention once per process (its `WrappedFlexAttention` singleton,
    `torch.compile(flex_attention)` with dynamic=None), so a second N in the same process would run
    a kernel dynamo recompiled for dynamic shapes. Resetting dynamo and handing the singleton a
    `dynamic=False` compilation makes each N's row a kernel compiled for that N, as a process of
    its own would run."""
    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as hf_flex

    torch._dynamo.reset()
    wrapped = hf_flex.WrappedFlexAttention(True)  # the singleton, in training mode (as the rows run)
    if not hasattr(wrapped, "_compiled_flex_attention"):
        raise RuntimeError("transformers' WrappedFlexAttention changed: cannot compile flex per N")
    wrapped._compiled_flex_attention = torch.compile(flex_attention, dynamic=False)


def use(model: Any, name: str) -> Any:
    """`model` set up for the row `name` (AttnFuse: patched by apply, which stays)."""
    if name == "attnfuse":
        from attnfuse.integrations.transformers import apply

        return apply(model)
    model.set_attn_implementation("flex_attention" if name == "flex" else "sdpa")
    return model


def train_steps(
    model: Any, ids: torch.Tensor, name: str, steps: int, warmup: int, profile: Path | None = None
) -> dict[str, Any]:
    """Median step time, peak memory and the first step's loss of `steps` optimizer steps, and the
    GPU's SM clock and power over them (`C.GpuSampler`); with `profile`, one more step under
    torch.profiler, its kernels' table written there."""
    fused = ids.device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=fused)
    times: list[float] = []
    losses: list[float] = []
    sampler = C.GpuSampler()
    if fused:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()
    with backend_context(name), rope_peer(name):
        for i in range(warmup + steps):
            if i == warmup and fused:
                sampler.start()
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if fused:
                torch.cuda.synchronize()
            losses.append(loss.item())
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        gpu = sampler.stop() if fused else {}
        peak = torch.cuda.max_memory_allocated() / 2**30 if fused else None
        # cudaMalloc calls that failed and were retried after freeing the allocator's cache (each
        # synchronizes the device): a step near the memory's limit pays for them.
        retries = torch.cuda.memory_stats().get("num_alloc_retries") if fused else None
        if profile is not None:
            profile_step(model, ids, opt, profile)
    del opt
    return {"step_ms": statistics.median(times), "peak_gib": peak, "alloc_retries": retries, "first_loss": losses[0],
            **gpu}  # fmt: skip


def profile_step(model: Any, ids: torch.Tensor, opt: Any, path: Path) -> None:
    """One training step under torch.profiler: the kernels (or, on the CPU, the ops) by their own
    time, the top 40, written to `path` (the table's footer gives the step's total)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = ids.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    path.write_text(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=90))


TRAIN_IMPLS = ("sdpa_cudnn", "sdpa_cudnn+liger_rope", "sdpa_cudnn+compiled_rope", "sdpa_flash", "flex", "attnfuse",
               "sdpa_math")  # fmt: skip
"""The training step's rows, in their order (the last, SDPA's math backend, for the CPU smoke run)."""


def part_train(args: argparse.Namespace, rows: list[dict]) -> None:
    dtype, device = (torch.float32, "cpu") if args.cpu_smoke else (torch.bfloat16, "cuda")
    names = ["sdpa_math", "attnfuse"] if args.cpu_smoke else list(TRAIN_IMPLS[:-1])
    names = [x for x in names if args.impls is None or x in args.impls]
    cfg = TINY if args.cpu_smoke else LLAMA3_8B
    model = make_model("llama", cfg, "sdpa", dtype, device)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # AttnFuse last: apply() patches the model for good.
    for name, n in [(name, n) for name in names for n in args.ns]:
        model.load_state_dict(state)
        model = use(model, name)
        if name == "flex":
            static_flex()
        ids = torch.randint(0, cfg["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n)).to(device)
        prof = args.out / f"profile_llama3-8b_{n}_{name.replace('+', '_')}.txt" if args.profile else None
        try:
            r = train_steps(model, ids, name, args.steps, args.warmup, prof)
        except Exception as e:  # an impl that cannot run this shape is recorded
            r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append({"part": "train", "model": "llama3-8b" if not args.cpu_smoke else "tiny", "n": n,
                     "impl": name, **r})  # fmt: skip
        C.log(str(rows[-1]))
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    del model
    gc.collect()


def part_qwen(args: argparse.Namespace, rows: list[dict]) -> None:
    """Qwen3-8B's training step at the first N (QK-norm fused too), against SDPA cuDNN."""
    if args.cpu_smoke:
        return
    dtype, device = torch.bfloat16, "cuda"
    torch.cuda.empty_cache()
    model = make_model("qwen3", QWEN3_8B, "sdpa", dtype, device)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    n = args.ns[0]
    ids = torch.randint(0, QWEN3_8B["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n)).to(device)
    for name in ["sdpa_cudnn", "sdpa_cudnn+liger_rope", "sdpa_cudnn+compiled_rope", "attnfuse"]:
        if args.impls is not None and name not in args.impls:
            continue
        model.load_state_dict(state)
        model = use(model, name)
        prof = args.out / f"profile_qwen3-8b_{n}_{name.replace('+', '_')}.txt" if args.profile else None
        try:
            r = train_steps(model, ids, name, args.steps, args.warmup, prof)
        except Exception as e:  # a peer that cannot run (liger-kernel missing) is recorded
            r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append({"part": "train", "model": "qwen3-8b", "n": n, "impl": name, **r})
        C.log(str(rows[-1]))
    del model
    gc.collect()
    torch.cuda.empty_cache()


INFER_CACHES: dict[str, dict[str, Any]] = {
    "dynamic": {},
    "static": {"cache_implementation": "static", "disable_compile": True},
    # transformers compiles the decoding steps against a static cache by itself (its default
    # CompileConfig: mode "reduce-overhead", CUDA graphs); the prefill stays uncompiled.
    "static+compile": {"cache_implementation": "static"},
    # The dynamic cache with the model's forward compiled by the caller (dynamic shapes: the cache
    # grows every step); generate() itself compiles only compileable (static) caches.
    "dynamic+compile": {},
}


@contextlib.contextmanager
def cache_setup(model: Any, cache: str, cpu_smoke: bool) -> Any:
    """`model` set up for the rows of `cache`: for `dynamic+compile` its forward compiled (dynamic
    shapes; aot_eager without a GPU), restored after."""
    eager = model.forward
    if cache == "dynamic+compile":
        model.forward = torch.compile(eager, dynamic=True, backend="aot_eager" if cpu_smoke else "inductor")
    try:
        yield
    finally:
        model.forward = eager


class FirstToken:
    """A generate() streamer that records when the first new token is out (the first `put` is
    the prompt, the second the first new token): the time to first token."""

    def __init__(self, device: str):
        self.device, self.puts, self.at = device, 0, 0.0

    def put(self, value: Any) -> None:
        self.puts += 1
        if self.puts == 2:
            if self.device == "cuda":
                torch.cuda.synchronize()
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def part_infer(args: argparse.Namespace, rows: list[dict]) -> None:
    dtype, device = (torch.float32, "cpu") if args.cpu_smoke else (torch.bfloat16, "cuda")
    cfg = TINY if args.cpu_smoke else LLAMA3_8B
    model = make_model("llama", cfg, "sdpa", dtype, device).eval()
    outputs: dict[tuple[str, str, int], torch.Tensor] = {}
    for name in ["sdpa", "attnfuse"]:
        model = use(model, name)
        for cache in args.caches:
            with cache_setup(model, cache, args.cpu_smoke):
                infer_rows(args, rows, model, name, cache, outputs)
    del model
    gc.collect()


def infer_rows(args: argparse.Namespace, rows: list[dict], model: Any, name: str, cache: str, outputs: dict) -> None:
    """The `infer` rows of one implementation and cache configuration, one per prompt length."""
    device = "cpu" if args.cpu_smoke else "cuda"
    cfg = TINY if args.cpu_smoke else LLAMA3_8B
    new = 4 if args.cpu_smoke else 64
    for p in args.prompts:
        ids = torch.randint(0, cfg["vocab_size"], (1, p), generator=torch.Generator().manual_seed(p)).to(device)

        def gen(streamer: Any = None, ids: torch.Tensor = ids, cache: str = cache, model: Any = model) -> Any:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                     streamer=streamer, **INFER_CACHES[cache])  # fmt: skip
            if device == "cuda":
                torch.cuda.synchronize()
            return t0, out

        gen()  # warm-up: compiles, for the same shapes as the timed runs
        firsts = []
        for _ in range(2):
            streamer = FirstToken(device)
            t0, _ = gen(streamer)
            firsts.append((streamer.at - t0) * 1e3)
        prefill = min(firsts)
        totals = []
        for _ in range(3):
            t0, out = gen()
            totals.append((time.perf_counter() - t0) * 1e3)
        total = statistics.median(totals)
        outputs[(name, cache, p)] = out
        same = None
        if name == "attnfuse":  # greedy tokens identical to SDPA's, counted up to the first that differs
            differ = (out[0, p:] != outputs[("sdpa", cache, p)][0, p:]).nonzero()
            same = int(differ[0, 0]) if len(differ) else new
        tok_s = (new - 1) / ((total - prefill) / 1e3)
        rows.append({"part": "infer", "model": "llama3-8b" if not args.cpu_smoke else "tiny", "prompt": p,
                     "cache": cache, "impl": name, "prefill_ms": prefill, "decode_tok_s": tok_s,
                     "same_tokens_as_sdpa": same})  # fmt: skip
        C.log(str(rows[-1]))


def part_fidelity(args: argparse.Namespace, rows: list[dict]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype, device = (torch.float32, "cpu") if args.cpu_smoke else (torch.bfloat16, "cuda")
    cfg = TINY if args.cpu_smoke else LLAMA3_8B
    prompts, steps = ([16], 4) if args.cpu_smoke else ([1024, 8192], 32)
    model = make_model("llama", cfg, "sdpa", dtype, device).eval()
    for p in prompts:
        ids = torch.randint(0, cfg["vocab_size"], (1, p), generator=torch.Generator().manual_seed(p)).to(device)
        with torch.no_grad():
            toks = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)

        def forced(m: Any, toks: torch.Tensor = toks, p: int = p) -> torch.Tensor:
            """The next-token logits [steps, vocab] of the prompt and each forced token after it."""
            with torch.no_grad():
                out = m(toks[:, :p], use_cache=True)
                logits = [out.logits[0, -1].float()]
                for i in range(steps - 1):
                    out = m(toks[:, p + i : p + i + 1], past_key_values=out.past_key_values, use_cache=True)
                    logits.append(out.logits[0, -1].float())
            return torch.stack(logits)

        base = forced(model)
        runs = {}
        if device == "cuda":
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                runs["sdpa_flash"] = forced(model)
        runs["attnfuse"] = forced(use(model, "attnfuse"))
        top2 = base.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        for name, logits in runs.items():
            rel = ((logits - base).norm(dim=-1) / base.norm(dim=-1)).tolist()
            agree = (logits.argmax(-1) == base.argmax(-1)).tolist()
            rows.append({"part": "fidelity", "prompt": p, "impl": name, "steps": steps,
                         "max_rel_l2": max(rel), "mean_rel_l2": sum(rel) / len(rel), "top1_agree": sum(agree),
                         "margins_where_differ": [round(m, 4) for m, a in zip(margin.tolist(), agree, strict=True)
                                                  if not a],
                         "median_margin": float(margin.median())})  # fmt: skip
            C.log(str(rows[-1]))
        model = make_model("llama", cfg, "sdpa", dtype, device).eval() if p != prompts[-1] else model
    del model
    gc.collect()


def part_loss(args: argparse.Namespace, rows: list[dict], out_dir: Path) -> None:
    device = "cpu" if args.cpu_smoke else "cuda"
    cfg, n = (TINY, 16) if args.cpu_smoke else (SMALL, 1024)
    steps = 3 if args.cpu_smoke else args.loss_steps
    # float32 weights, bfloat16 autocast: attention runs in bf16, the optimizer is stable.
    base = make_model("llama", cfg, "sdpa", torch.float32, device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=not args.cpu_smoke)
    g = torch.Generator().manual_seed(1)
    # Fixed synthetic data with structure to learn: sequences repeating a short random motif.
    motifs = torch.randint(0, cfg["vocab_size"], (8, 16), generator=g)
    data = motifs[torch.randint(0, 8, (steps, 1), generator=g)].repeat(1, 1, n // 16).view(steps, n).to(device)
    curves: dict[str, list[float]] = {}
    for name in ["sdpa", "attnfuse"]:
        model = use(copy.deepcopy(base), name)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
        curve = []
        for i in range(steps):
            ids = data[i : i + 1]
            with autocast:
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            curve.append(loss.item())
        curves[name] = curve
        del model, opt
    diff = max(abs(a - b) for a, b in zip(curves["sdpa"], curves["attnfuse"], strict=True))
    tail = max(1, steps // 10)
    rows.append({"part": "loss", "steps": steps, "n": n, "final_sdpa": sum(curves["sdpa"][-tail:]) / tail,
                 "final_attnfuse": sum(curves["attnfuse"][-tail:]) / tail, "max_abs_diff": diff})  # fmt: skip
    C.log(str(rows[-1]))
    (out_dir / "loss.json").write_text(json.dumps(curves))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, curve in curves.items():
            ax.plot(curve, label=name, linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_title(f"small Llama-style model, N={n}, fp32 weights, bf16 autocast")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "loss.png", dpi=120)
    except ImportError:
        pass


def fidelity_md(rows: list[dict]) -> list[str]:
    """The teacher-forcing table (part `fidelity`), or nothing."""
    if not rows:
        return []
    lines = ["## Teacher-forced next-token logits against SDPA (default backend)", "",
             "| prompt | impl | steps | max rel L2 | mean rel L2 | top-1 agrees | SDPA's top-1 margin where not |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        margins = f"{r['margins_where_differ']} (median margin {r['median_margin']:.3f})"
        lines.append(
            f"| {r['prompt']} | {r['impl']} | {r['steps']} | {r['max_rel_l2']:.2e} | {r['mean_rel_l2']:.2e} | "
            f"{r['top1_agree']}/{r['steps']} | {margins} |"
        )
    return [*lines, ""]


def write_md(rows: list[dict], out: Path, env: dict[str, Any]) -> None:
    lines = ["# Hugging Face models with AttnFuse attention", "", C.env_markdown(env), ""]
    train = [r for r in rows if r["part"] == "train"]
    if train:
        lines += ["## Training step (batch 1, bf16, fused AdamW)", "",
                  "| model | N | impl | step ms | peak GiB | alloc retries | first loss | step vs sdpa_cudnn "
                  "| step vs sdpa_cudnn+liger_rope | SM MHz (median) | W (mean) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

        def ratio(r: dict, impls: tuple[str, ...]) -> str:
            """Peer step ms / this row's (> 1: this row is faster)."""
            ref = next((x for x in train if x["model"] == r["model"] and x["n"] == r["n"]
                        and x["impl"] in impls and "step_ms" in x), None)  # fmt: skip
            return f"{ref['step_ms'] / r['step_ms']:.3f}x" if ref else ""

        for r in train:
            if "step_ms" not in r:
                error = r.get("error", "")[:80]
                lines.append(f"| {r['model']} | {r['n']} | {r['impl']} | error: {error} | | | | | | | |")
                continue
            peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else ""
            retries = "" if r.get("alloc_retries") is None else r["alloc_retries"]
            cells = [r["model"], r["n"], r["impl"], f"{r['step_ms']:.1f}", peak, retries, f"{r['first_loss']:.4f}"]
            cells += [ratio(r, ("sdpa_cudnn", "sdpa_math")), ratio(r, ("sdpa_cudnn+liger_rope",))]
            cells += [f"{r['sm_mhz_median']:.0f}", f"{r['power_w_mean']:.0f}"] if r.get("gpu_samples") else ["", ""]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        sampler_errors = {r["gpu_sampler"] for r in train if r.get("gpu_sampler")}
        if sampler_errors:
            lines += ["", f"No clock or power samples: {'; '.join(sorted(sampler_errors))}."]
        lines.append("")
    infer = [r for r in rows if r["part"] == "infer"]
    if infer:
        lines += ["## Inference (generate, greedy)", "",
                  "| prompt | cache | impl | prefill ms | decode tok/s | decode vs sdpa | new tokens equal to sdpa's |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        sdpa = {(r["prompt"], r["cache"]): r for r in infer if r["impl"] == "sdpa"}
        for r in infer:
            peer = sdpa.get((r["prompt"], r["cache"]))
            vs = f"{r['decode_tok_s'] / peer['decode_tok_s']:.2f}x" if peer and r["impl"] != "sdpa" else ""
            lines.append(
                f"| {r['prompt']} | {r['cache']} | {r['impl']} | {r['prefill_ms']:.1f} | {r['decode_tok_s']:.1f} | "
                f"{vs} | {'' if r['same_tokens_as_sdpa'] is None else r['same_tokens_as_sdpa']} |"
            )
        lines.append("")
    lines += fidelity_md([r for r in rows if r["part"] == "fidelity"])
    for r in rows:
        if r["part"] == "loss":
            lines += [f"## Loss curves ({r['steps']} steps, N={r['n']})", "",
                      f"mean loss of the last tenth: sdpa {r['final_sdpa']:.4f}, attnfuse {r['final_attnfuse']:.4f}; "
                      f"max |difference| over the run {r['max_abs_diff']:.4f}. ![loss](loss.png)", ""]  # fmt: skip
    (out / "hf.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="train,loss,infer,fidelity,qwen")
    ap.add_argument("--ns", default="4096,8192")
    ap.add_argument("--prompts", default="1024,8192", help="infer: prompt lengths")
    ap.add_argument("--caches", default=",".join(INFER_CACHES), help=f"infer: caches, of {list(INFER_CACHES)}")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--loss-steps", type=int, default=200)
    ap.add_argument("--impls", default=None, help="train, qwen: only these rows (comma-separated), e.g. attnfuse")
    ap.add_argument("--profile", action="store_true", help="train, qwen: profile one more step per row")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    args.ns = [16] if args.cpu_smoke else [int(x) for x in args.ns.split(",")]
    args.prompts = [16] if args.cpu_smoke else [int(x) for x in args.prompts.split(",")]
    args.caches = args.caches.split(",")
    args.impls = None if args.impls is None else args.impls.split(",")
    if args.impls is not None and (unknown := set(args.impls) - set(TRAIN_IMPLS)):
        ap.error(f"--impls: unknown {sorted(unknown)}; choose from {list(TRAIN_IMPLS)}")
    if unknown := set(args.caches) - set(INFER_CACHES):
        ap.error(f"--caches: unknown {sorted(unknown)}; choose from {list(INFER_CACHES)}")
    if args.cpu_smoke:
        args.steps, args.warmup = 1, 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    env = C.environment()
    ctx = af.backend("interpret") if args.cpu_smoke else af.backend("auto")
    with ctx:
        for part in args.parts.split(","):
            t0 = time.perf_counter()
            parts = {
                "train": lambda: part_train(args, rows),
                "infer": lambda: part_infer(args, rows),
                "fidelity": lambda: part_fidelity(args, rows),
                "loss": lambda: part_loss(args, rows, args.out),
                "qwen": lambda: part_qwen(args, rows),
            }
            parts[part]()
            C.log(f"part {part} done in {time.perf_counter() - t0:.0f}s")
            C.write_json(args.out / "hf.json", {"environment": env, "rows": rows})
            write_md(rows, args.out, env)
    print((args.out / "hf.md").read_text())
    bad = [r for r in rows if "error" in r or r.get("same_tokens_as_sdpa") == 0]
    if args.cpu_smoke and bad:
        sys.exit(f"smoke: {len(bad)} bad rows")


if __name__ == "__main__":
    main()
