"""Sharded training on 2 GPUs: a Llama-3-8B training step with FSDP2
(`torch.distributed.fsdp.fully_shard`), AttnFuse attention through the Hugging Face integration
against SDPA cuDNN, in one torchrun job (issue 14, item 1).

    torchrun --nproc-per-node 2 benchmarks/train_fsdp.py --out DIR [--n 4096] [--layers 32] [--compile]
    torchrun --nproc-per-node 2 benchmarks/train_fsdp.py --smoke   # CPU: gloo, tiny model (--out: a temp dir)

Every backend trains the same model from the same weights on the same data:

- the model: Llama-3-8B's released config (`bench_hf.LLAMA3_8B`; `--layers` keeps fewer decoder
  layers for a quick run), built on the meta device, each decoder layer `fully_shard`-ed, then the
  whole model; then materialised (`to_empty`) and initialised as transformers does (normal(0,
  0.02) for linear and embedding weights, ones for the norms), each parameter from its own seed
  (its name), so the weights do not depend on the backend, the world size or `--compile`.
- precision: float32 master weights sharded over the ranks, `MixedPrecisionPolicy(param_dtype=
  bfloat16, reduce_dtype=float32)`: compute in bf16, gradients reduced and AdamW (lr `--lr`, no
  weight decay) run in float32. Why: it is torchtitan's default, AdamW's float32 states keep small
  updates that bf16 weights would round away, and it fits: per rank, half of 8B parameters' float32
  weights, gradients and two AdamW states is 16 + 16 + 32 = 64 GB, plus about 26 GB of activations
  at N = 4096 (bench_hf's 1-GPU step peaked at 90 GiB over 64 GB of bf16 states), about 90 of the
  H200's 141 GB. `--precision bf16` keeps bf16 weights and states instead (half the states).
- data: fixed synthetic batches, one sequence of N tokens per GPU per step (a different one on
  each rank), repeating a short random motif so that there is something to learn; the same on
  every backend.
- backends (`--backends`, in that order): `attnfuse` (`attnfuse.integrations.transformers.apply`
  before sharding), `sdpa_cudnn` (attn_implementation "sdpa" under `sdpa_kernel(CUDNN_ATTENTION)`),
  `sdpa_flash`. `--compile` compiles every decoder layer (`torch.compile(layer)`, before
  `fully_shard`, as torchtitan does) on every backend.

Per backend: `--steps` optimizer steps (20); the loss of each (mean over the ranks), the median
step time over the steps after `--warmup` (3; each step after a barrier, max over the ranks),
tokens/s per GPU (N / step time) and the peak memory (max over the ranks). Then the loss curves
against the first backend's: max |difference| over the steps (bf16 noise: a few 1e-3 to 1e-2).

Writes DIR/fsdp.json and DIR/fsdp.md after every backend. `--smoke`: CPU, gloo, a tiny Llama
config in float32, AttnFuse under the Triton interpreter against SDPA's math backend, 3 steps; it
exits non-zero if a backend fails or the curves differ by more than 1e-3.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--smoke" in sys.argv or "--cpu-smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import common as C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from bench_hf import LLAMA3_8B, TINY  # noqa: E402 - one definition of Llama-3-8B's config

import attnfuse as af  # noqa: E402


def log(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        C.log(msg)


def all_reduce(x: float, device: torch.device, op: Any = None) -> float:
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op is None else op)
    return t.item()


# --------------------------------------------------------------------------- the model


def build(args: argparse.Namespace, backend: str, device: torch.device) -> Any:
    """The sharded, initialised model for `backend` (see the module docstring)."""
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cfg = dict(TINY if args.smoke else LLAMA3_8B)
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    config = transformers.LlamaConfig(**cfg)
    config._attn_implementation = "sdpa"
    config.use_cache = False
    bf16 = args.precision == "bf16" and device.type == "cuda"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if bf16 else torch.float32)
    if backend == "attnfuse":
        from attnfuse.integrations.transformers import apply

        model = apply(model)
    layers = model.model.layers
    if args.compile:
        for i, layer in enumerate(list(layers)):
            layers[i] = torch.compile(layer, dynamic=False)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if args.precision == "mixed" and device.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    model.to_empty(device=device)
    init_weights(model, config, device)
    # Non-persistent buffers (RoPE's inv_freq) were on the meta device: rebuild the rotary module.
    rotary = model.model.rotary_emb
    with torch.device(device):
        model.model.rotary_emb = type(rotary)(config=model.config)
    return model.train()


@torch.no_grad()
def init_weights(model: Any, config: Any, device: torch.device) -> None:
    """transformers' initialisation, each parameter's full tensor drawn from a generator seeded
    by its name (independent of backend, world size and compile), this rank's shard kept."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    std = getattr(config, "initializer_range", 0.02) or 0.02
    for name, p in model.named_parameters():
        clean = name.replace("_orig_mod.", "")
        g = torch.Generator(device=device).manual_seed(zlib.crc32(clean.encode()))
        full = torch.empty(p.shape, device=device, dtype=torch.float32)
        if clean.endswith("norm.weight"):
            full.fill_(1.0)
        else:
            full.normal_(0.0, std, generator=g)
        if not isinstance(p, DTensor):
            p.copy_(full)
            continue
        mine = p.to_local()
        chunk = full.chunk(dist.get_world_size(), dim=0)[dist.get_rank()]  # fully_shard's Shard(0)
        if chunk.shape != mine.shape:  # another layout: let DTensor cut it (all ranks hold `full`)
            chunk = distribute_tensor(full, p.device_mesh, p.placements).to_local()
        mine.copy_(chunk)


def data(args: argparse.Namespace, vocab: int, device: torch.device) -> torch.Tensor:
    """[steps, N] token ids for this rank: sequences repeating one of 8 motifs of 16 tokens."""
    g = torch.Generator().manual_seed(1000 + dist.get_rank())
    motifs = torch.randint(0, vocab, (8, 16), generator=g)
    reps = -(-args.n // 16)
    seqs = motifs[torch.randint(0, 8, (args.steps,), generator=g)].repeat(1, reps)[:, : args.n]
    return seqs.to(device)


def backend_context(backend: str) -> Any:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kinds = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}
    return sdpa_kernel([kinds[backend]]) if backend in kinds else contextlib.nullcontext()


def train(args: argparse.Namespace, backend: str, device: torch.device) -> dict[str, Any]:
    """`args.steps` steps of `backend`: losses, step times, peak memory."""
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    model = build(args, backend, device)
    log(f"{backend}: model built and sharded in {time.perf_counter() - t0:.1f}s")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    ids = data(args, model.config.vocab_size, device)
    losses: list[float] = []
    times: list[float] = []
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    with backend_context(backend):
        for i in range(args.steps):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            batch = ids[i : i + 1]
            loss = model(input_ids=batch, labels=batch, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(device)
            ms = (time.perf_counter() - t) * 1e3
            losses.append(all_reduce(loss.item(), device, dist.ReduceOp.SUM) / dist.get_world_size())
            times.append(all_reduce(ms, device))
            log(f"{backend} step {i}: loss {losses[-1]:.4f}, {times[-1]:.0f} ms")
    peak = all_reduce(torch.cuda.max_memory_allocated(device) / 2**30, device) if cuda else None
    timed = times[args.warmup :] or times
    step_ms = statistics.median(timed)
    del model, opt
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return {"step_ms": step_ms, "tokens_per_s_per_gpu": args.n / (step_ms / 1e3), "peak_gib": peak,
            "losses": losses, "step_times_ms": times, "first_step_ms": times[0]}  # fmt: skip


# --------------------------------------------------------------------------- output


def write(args: argparse.Namespace, rows: list[dict], env: dict[str, Any]) -> None:
    C.write_json(
        args.out / "fsdp.json", {"environment": env, "args": vars(args) | {"out": str(args.out)}, "rows": rows}
    )
    model = "tiny Llama (CPU smoke)" if args.smoke else f"Llama-3-8B ({args.layers or 32} layers)"
    prec = "float32 master weights, bf16 compute (MixedPrecisionPolicy)" if args.precision == "mixed" else "bf16"
    if args.smoke:
        prec = "float32"
    lines = [
        "# FSDP2 training step on 2 GPUs",
        "",
        C.env_markdown(env),
        f"{model}, random weights, FSDP2 (fully_shard per decoder layer, then the model), {prec}, AdamW lr "
        f"{args.lr:g}, batch 1 per GPU, N={args.n}, {args.steps} steps (timed after {args.warmup}), "
        f"compile: {args.compile}.",
        "",
        "| backend | step ms | tokens/s per GPU | peak GiB | first loss | last loss | max loss diff vs first row | "
        "step vs first row |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ref = next((r for r in rows if "losses" in r), None)
    for r in rows:
        if "losses" not in r:
            lines.append(f"| {r['backend']} | error: {r.get('error', '')[:120]} | | | | | | |")
            continue
        diff = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"], strict=False)) if ref else 0.0
        peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") else ""
        ratio = f"{ref['step_ms'] / r['step_ms']:.3f}x" if ref else ""
        lines.append(
            f"| {r['backend']} | {r['step_ms']:.1f} | {r['tokens_per_s_per_gpu']:.0f} | {peak} | "
            f"{r['losses'][0]:.4f} | {r['losses'][-1]:.4f} | {diff:.4f} | {ratio} |"
        )
    lines.append("")
    if ref:
        lines += ["## Loss curves (mean over the ranks)", "", "| step | " + " | ".join(r["backend"] for r in rows
                  if "losses" in r) + " |", "|---|" + "---|" * sum("losses" in r for r in rows)]  # fmt: skip
        for i in range(len(ref["losses"])):
            cells = [f"{r['losses'][i]:.4f}" if i < len(r["losses"]) else "" for r in rows if "losses" in r]
            lines.append(f"| {i} | " + " | ".join(cells) + " |")
        lines.append("")
    (args.out / "fsdp.md").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for fsdp.json and fsdp.md (default: a new temporary folder, printed at the end)",
    )
    ap.add_argument("--n", type=int, default=4096, help="tokens per sequence (batch 1 per GPU)")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (0: the config's, 32)")
    ap.add_argument("--backends", default="attnfuse,sdpa_cudnn")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--precision", default="mixed", choices=["mixed", "bf16"])
    ap.add_argument("--compile", action="store_true", help="torch.compile every decoder layer")
    ap.add_argument("--budget-s", type=float, default=170.0, help="no new backend starts after this many seconds")
    ap.add_argument(
        "--smoke", "--cpu-smoke", action="store_true", dest="smoke", help="CPU: gloo, tiny model, interpreter, 3 steps"
    )
    args = ap.parse_args()
    t_start = time.perf_counter()
    if args.smoke:
        args.n, args.steps, args.warmup = 32, 3, 1
        args.backends = args.backends.replace("sdpa_cudnn", "sdpa").replace("sdpa_flash", "sdpa")
    device = C.init_distributed(args.smoke)
    if args.out is None:  # only rank 0 writes: the other ranks' folder is never used
        args.out = Path(tempfile.mkdtemp(prefix="attnfuse-fsdp-")) if dist.get_rank() == 0 else Path(".")
    args.out.mkdir(parents=True, exist_ok=True)
    if device.type != "cuda" and not args.smoke:
        sys.exit("train_fsdp.py needs CUDA GPUs (or --smoke)")
    if args.compile:
        C.raise_recompile_limits()
    rows = run_backends(args, device, t_start)
    good = [r for r in rows if "losses" in r]
    diff = None
    if len(good) >= 2:
        diff = max(abs(a - b) for a, b in zip(good[0]["losses"], good[1]["losses"], strict=False))
        log(f"loss curves: {good[0]['backend']} {good[0]['losses']}")
        log(f"             {good[1]['backend']} {good[1]['losses']}")
        log(f"max |loss difference| over {len(good[0]['losses'])} steps: {diff:.5f}")
    if dist.get_rank() == 0:
        print((args.out / "fsdp.md").read_text())
        print(f"written: {args.out / 'fsdp.json'}, {args.out / 'fsdp.md'}")
    dist.destroy_process_group()
    if args.smoke and (len(good) < len(rows) or not good or (diff is not None and diff > 1e-3)):
        sys.exit(f"smoke: {len(rows) - len(good)} failed backends, loss difference {diff}")


def run_backends(args: argparse.Namespace, device: torch.device, t_start: float) -> list[dict]:
    """Every backend in turn, within the budget; the rows (written after each)."""
    env = C.environment() if dist.get_rank() == 0 else {}
    rows: list[dict] = []
    suffix = "+compile" if args.compile else ""
    with af.backend("interpret") if args.smoke else contextlib.nullcontext():
        for backend in [b for b in dict.fromkeys(args.backends.split(",")) if b]:
            if all_reduce(float(time.perf_counter() - t_start > args.budget_s), device) > 0:
                log(f"budget of {args.budget_s:.0f}s spent: stopping before {backend}")
                break
            try:
                row = {"backend": backend + suffix, **train(args, backend, device)}
            except Exception as e:  # noqa: BLE001 - recorded (the other backends still run)
                row = {"backend": backend + suffix, "error": f"{type(e).__name__}: {str(e)[:400]}"}
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            log(f"[{time.perf_counter() - t_start:.0f}s] {row}")
            if dist.get_rank() == 0:
                write(args, rows, env)
    return rows


if __name__ == "__main__":
    main()
