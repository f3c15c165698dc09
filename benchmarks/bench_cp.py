"""Context parallelism on 2 GPUs: one Llama-3-8B attention layer (B=1, Hq=32, Hkv=8, D=128,
bf16, RoPE theta 500000 with Llama 3.1's scaling, causal), forward + backward, the sequence
sharded over the ranks of a torchrun job (issue 14, item 4).

    torchrun --nproc-per-node 2 benchmarks/bench_cp.py --out DIR [--ns 32768,65536,131072]
    torchrun --nproc-per-node 2 benchmarks/bench_cp.py --out DIR --smoke    # CPU: gloo, interpreter

Rows, per N (every rank holds chunks r and 2W-1-r of the sequence, `attnfuse.distributed.shard`,
which is also the layout of torch's head-tail load balancer):

- `attnfuse_cp`: `attnfuse.distributed.attention` on the local shards (RoPE fused in the kernels).
- `cp_sdpa_cudnn`, `cp_sdpa_flash`: PyTorch's own context parallel,
  `torch.distributed.tensor.experimental.context_parallel` (load balancing on, rotate method
  `--rotate`, default allgather), SDPA restricted to one backend with `sdpa_kernel`. Its RoPE is a
  float32 function compiled with `torch.compile(dynamic=False)`, applied to the local shards at
  their global positions (the `buffers` context_parallel shards for us are those positions).
  GQA: `enable_gqa=True` is tried first; where CP's ring SDPA refuses it, K and V are expanded to
  32 heads after the RoPE (inside the timed step) and the row says `gqa: expanded`.
- `attnfuse_1gpu`, `sdpa_cudnn_1gpu`: rank 0 alone on the full sequence, no distribution (the
  other rank waits), at `--single-ns` (default 65536): scaling efficiency 1 -> 2 GPUs is
  T1 / (2 T2), measured in the same run on the same machine.

Timing: every step is forward + backward with the gradients reset; each repetition starts
after a barrier and a synchronize and is timed with CUDA events on each rank; the row's time is
the median over repetitions, max over the ranks. Repetitions: as many as fit `--target-s` per
row (at least 3, the same on every rank). TFLOP/s per GPU: causal FLOPs
4 B Hq N^2 D / 2 x 3.5 (forward + backward) divided by the GPUs and the time.
Correctness, once per N: AttnFuse CP's output and dq, dk, dv against the first peer's (relative L2,
max over ranks), printed and kept in the rows. A row that fails records its error.

Writes DIR/cp.json (rows, environment) and DIR/cp.md after every row (a timeout keeps what was
measured). `--smoke` runs on CPU without a GPU: gloo, tiny shapes in float32 under the Triton
interpreter, AttnFuse CP only (the peer needs CUDA SDPA), checked against an eager float32
formula on the full sequence; it exits non-zero if the check fails.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--smoke" in sys.argv or "--cpu-smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import common as C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnfuse as af  # noqa: E402
from attnfuse import distributed as cp  # noqa: E402
from attnfuse.rope_freqs import inv_freq as rope_inv_freq  # noqa: E402

THETA = 500000.0
LLAMA3_SCALING = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192.0)
FWD_BWD = 3.5


def log(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        C.log(msg)


def causal_flops(b: int, hq: int, n: int, d: int) -> float:
    """Forward + backward FLOPs of causal attention: 4 B H N^2 D / 2 x 3.5."""
    return 4.0 * b * hq * n * n * d / 2 * FWD_BWD


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def all_max(x: float, device: torch.device) -> float:
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def all_gather_floats(x: float, device: torch.device) -> list[float]:
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.item() for o in out]


# --------------------------------------------------------------------------- RoPE for the peer


def rope_tables(pos: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin [len(pos), d/2] at the given global positions (Llama 3.1 frequencies)."""
    freqs, mag = rope_inv_freq(THETA, d, "llama3", **LLAMA3_SCALING)
    inv = torch.tensor(freqs, dtype=torch.float64, device=pos.device)
    angle = pos.to(torch.float64)[:, None] * inv[None, :]
    return (angle.cos() * mag).float(), (angle.sin() * mag).float()


def pre_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The peers' RoPE: half-style rotation in float32, back to the input dtype."""
    return C.rope_half(q.float(), cos, sin).to(q.dtype), C.rope_half(k.float(), cos, sin).to(k.dtype)


# --------------------------------------------------------------------------- timing


def timed(step: Any, device: torch.device, target_s: float, warmup: int, distributed: bool) -> dict[str, Any]:
    """Median ms of `step()` over repetitions (each after a barrier when `distributed`); the
    repetition count and the result are agreed over the ranks (max)."""
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def once() -> float:
        if distributed:
            dist.barrier()
        sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            sync()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        step()
        return (time.perf_counter() - t0) * 1e3

    for _ in range(warmup):
        once()
    first = once()
    if distributed:
        first = all_max(first, device)
    reps = max(3, min(50, int(target_s * 1e3 / max(first, 1e-3))))
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = [once() for _ in range(reps)]
    ms = statistics.median(times)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    if distributed:
        per_rank = all_gather_floats(ms, device)
        peak = all_max(peak or 0.0, device) if cuda else None
        return {"ms": max(per_rank), "ms_per_rank": per_rank, "reps": reps, "peak_gib": peak}
    return {"ms": ms, "reps": reps, "peak_gib": peak}


# --------------------------------------------------------------------------- the rows


class Case:
    """One N: the full-sequence inputs (same on every rank) and this rank's shards."""

    def __init__(self, n: int, shape: C.Shape, device: torch.device, keep_full: bool):
        g = torch.Generator(device=device).manual_seed(n)
        b, hq, hkv, d = shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim

        def randn(h: int) -> torch.Tensor:
            return torch.randn(b, h, n, d, generator=g, device=device, dtype=shape.dtype)

        full = [randn(hq), randn(hkv), randn(hkv), randn(hq)]
        self.n, self.shape, self.device = n, shape, device
        self.q, self.k, self.v, self.dout = (cp.shard(x).contiguous() for x in full)
        for x in (self.q, self.k, self.v):
            x.requires_grad_()
        self.pos = cp.positions(n, device=device)
        self.full = full if keep_full else None

    def reset(self) -> None:
        for x in (self.q, self.k, self.v):
            x.grad = None

    def grads(self) -> dict[str, torch.Tensor]:
        assert self.q.grad is not None and self.k.grad is not None and self.v.grad is not None
        return {"dq": self.q.grad.clone(), "dk": self.k.grad.clone(), "dv": self.v.grad.clone()}


def attnfuse_cp_step(case: Case) -> Any:
    def step() -> torch.Tensor:
        case.reset()
        out = cp.attention(case.q, case.k, case.v, theta=THETA, scaling=af.llama3_scaling(**LLAMA3_SCALING))
        out.backward(case.dout)
        return out

    return step


@functools.cache
def device_mesh(device_type: str) -> Any:
    """The 1-D mesh of every rank (built once)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (dist.get_world_size(),))


def cp_peer(case: Case, backend: str, rotate: str, rope: Any) -> tuple[Any, Any]:
    """(context manager factory, step factory) of PyTorch's context parallel with SDPA
    restricted to `backend`; step factory(native_gqa) gives the step with enable_gqa or with
    K and V expanded to Hq heads."""
    import contextlib

    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:  # torch's CP options are private (torch 2.11 and 2.13 have this path)
        from torch.distributed.tensor.experimental._attention import set_rotate_method
    except ImportError:
        log(f"set_rotate_method not found in this torch {torch.__version__}: CP's default rotate method")
    else:
        set_rotate_method(rotate)
    mesh = device_mesh(case.device.type)
    kind = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    cos, sin = rope_tables(case.pos, case.shape.head_dim)
    groups = case.shape.q_heads // case.shape.kv_heads

    def make_step(native_gqa: bool) -> Any:
        def step() -> torch.Tensor:
            case.reset()
            q, k = rope(case.q, case.k, cos, sin)
            v = case.v
            if not native_gqa and groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            # F.scaled_dot_product_attention is looked up here: context_parallel patches it.
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=native_gqa and groups > 1)
            out.backward(case.dout)
            return out

        return step

    @contextlib.contextmanager
    def context() -> Any:
        # The one buffer context_parallel shards (head-tail, in place) is the global positions,
        # [1, N]: q, k and v are already this rank's shards (attnfuse.distributed.shard, the
        # same layout), which the sharded positions confirm.
        pos = torch.arange(case.n, device=case.device).view(1, case.n)
        with sdpa_kernel([kind]), context_parallel(mesh, buffers=[pos], buffer_seq_dims=[1]):
            if not torch.equal(pos.view(-1), case.pos):
                raise RuntimeError(f"torch's CP layout differs from attnfuse.distributed.shard's: {pos.view(-1)[:8]}")
            yield

    return context, make_step


def run_peer(case: Case, backend: str, args: argparse.Namespace, rope: Any, ref: dict | None) -> dict[str, Any]:
    """One CP peer row: probe enable_gqa, check against AttnFuse's result, time."""
    context, make_step = cp_peer(case, backend, args.rotate, rope)
    row: dict[str, Any] = {}
    with context():
        mode = "native"
        try:
            out = make_step(True)()
            ok = 1.0
        except Exception as e:  # noqa: BLE001 - the ring SDPA may refuse GQA: expand K/V instead
            row["gqa_native_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            ok = 0.0
        if all_max(1.0 - ok, case.device) > 0:
            mode = "expanded"
            out = make_step(False)()
        row["gqa"] = mode
        step = make_step(mode == "native")
        if ref is not None:
            got = {"out": out.detach(), **case.grads()}
            errs = {name: all_max(rel_l2(ref[name], got[name]), case.device) for name in got}
            row["attnfuse_vs_peer_rel_l2"] = errs
            log(f"N={case.n}: AttnFuse CP vs CP {backend} relative L2 {errs}")
            del got
        del out
        row.update(timed(step, case.device, args.target_s, args.warmup, distributed=True))
    return row


def run_single(case: Case, impl: str, args: argparse.Namespace, rope: Any) -> dict[str, Any]:
    """Rank 0 alone, the full sequence: AttnFuse (attnfuse.variants.llama3) or SDPA cuDNN."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnfuse import variants

    assert case.full is not None
    q, k, v, dout = (x.detach().clone() for x in case.full)
    for x in (q, k, v):
        x.requires_grad_()
    n, d = case.n, case.shape.head_dim
    groups = case.shape.q_heads // case.shape.kv_heads
    cos, sin = rope_tables(torch.arange(n, device=case.device), d)
    row: dict[str, Any] = {}

    def reset() -> None:
        for x in (q, k, v):
            x.grad = None

    if impl == "attnfuse_1gpu":

        def step() -> None:
            reset()
            variants.llama3(q, k, v).backward(dout)

        return timed(step, case.device, args.target_s, args.warmup, distributed=False)

    def cudnn_step(native: bool) -> Any:
        def step() -> None:
            reset()
            qr, kr = rope(q, k, cos, sin)
            vv = v
            if not native:
                kr, vv = kr.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(qr, kr, vv, is_causal=True, enable_gqa=native)
            out.backward(dout)

        return step

    try:
        cudnn_step(True)()
        row["gqa"] = "native"
    except Exception as e:  # noqa: BLE001 - expand K/V where cuDNN refuses GQA
        row["gqa"] = "expanded"
        row["gqa_native_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    row.update(timed(cudnn_step(row["gqa"] == "native"), case.device, args.target_s, args.warmup, distributed=False))
    return row


# --------------------------------------------------------------------------- output


def write(out: Path, rows: list[dict], env: dict[str, Any], args: argparse.Namespace) -> None:
    C.write_json(out / "cp.json", {"environment": env, "args": vars(args) | {"out": str(args.out)}, "rows": rows})
    what = (
        "CPU smoke run (B=1, Hq=4, Hkv=2, D=16, float32, interpreter): shapes below are not these. "
        if args.smoke
        else ""
    )
    lines = [
        "# Context parallelism: one Llama-3-8B attention layer, fwd+bwd, 2 GPUs",
        "",
        C.env_markdown(env),
        f"{what}B=1, Hq=32, Hkv=8, D=128, bf16, RoPE theta {THETA:g} with Llama 3.1 scaling, causal. "
        f"CP rotate method: {args.rotate}. Time: median per rank, max over ranks; TFLOP/s per GPU from causal "
        "FLOPs 4·B·H·N²·D/2 × 3.5. `vs cp_sdpa_cudnn`: its time / this row's (> 1: faster).",
        "",
        "| N | impl | GPUs | ms | TFLOP/s per GPU | vs cp_sdpa_cudnn | GQA | peak GiB "
        "| AttnFuse vs peer rel L2 (out, dq, dk, dv) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "ms" not in r:
            lines.append(f"| {r['n']} | {r['impl']} | {r['gpus']} | error: {r.get('error', '')[:100]} | | | | | |")
            continue
        ref = next((x for x in rows if x["n"] == r["n"] and x["impl"] == "cp_sdpa_cudnn" and "ms" in x), None)
        ratio = f"{ref['ms'] / r['ms']:.3f}x" if ref else ""
        errs = r.get("attnfuse_vs_peer_rel_l2")
        err = ", ".join(f"{errs[k]:.1e}" for k in ("out", "dq", "dk", "dv")) if errs else ""
        peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") else ""
        tf = C.tflops(causal_flops(1, 32, r["n"], 128) / r["gpus"], r["ms"])
        lines.append(
            f"| {r['n']} | {r['impl']} | {r['gpus']} | {r['ms']:.2f} | {tf:.0f} | {ratio} | {r.get('gqa', '')} | "
            f"{peak} | {err} |"
        )
    lines.append("")
    eff = scaling(rows)
    if eff:
        lines += ["## Scaling efficiency 1 -> 2 GPUs, T1 / (2 T2)", ""]
        lines += [f"- N={n}: {name} {e:.1%} ({t1:.1f} ms on 1 GPU, {t2:.1f} ms on 2)" for n, name, e, t1, t2 in eff]
        lines.append("")
    (out / "cp.md").write_text("\n".join(lines) + "\n")


def scaling(rows: list[dict]) -> list[tuple[int, str, float, float, float]]:
    pairs = [("attnfuse", "attnfuse_1gpu", "attnfuse_cp"), ("sdpa_cudnn", "sdpa_cudnn_1gpu", "cp_sdpa_cudnn")]
    res = []
    for n in sorted({r["n"] for r in rows}):
        for name, one, two in pairs:
            r1 = next((r for r in rows if r["n"] == n and r["impl"] == one and "ms" in r), None)
            r2 = next((r for r in rows if r["n"] == n and r["impl"] == two and "ms" in r), None)
            if r1 and r2:
                res.append((n, name, r1["ms"] / (2 * r2["ms"]), r1["ms"], r2["ms"]))
    return res


# --------------------------------------------------------------------------- smoke


def smoke(args: argparse.Namespace, device: torch.device) -> int:
    """CPU: AttnFuse CP on tiny fp32 shapes under the interpreter against an eager formula."""
    shape = C.Shape("smoke", 1, 4, 2, 16, torch.float32)
    rows: list[dict] = []
    env = C.environment() if dist.get_rank() == 0 else {}
    bad = 0
    with af.backend("interpret"):
        for n in args.ns:
            case = Case(n, shape, device, keep_full=True)
            out = attnfuse_cp_step(case)()
            got = {"out": cp.unshard(out.detach()), **{k: cp.unshard(g) for k, g in case.grads().items()}}
            assert case.full is not None
            q, k, v, dout = (x.detach().clone() for x in case.full)
            for x in (q, k, v):
                x.requires_grad_()
            cos, sin = rope_tables(torch.arange(n), shape.head_dim)
            qr, kr = pre_rope(q, k, cos, sin)
            g = shape.q_heads // shape.kv_heads
            ref = F.scaled_dot_product_attention(
                qr, kr.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True
            )
            ref.backward(dout)
            want = {"out": ref.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
            errs = {name: all_max(rel_l2(got[name], want[name]), device) for name in got}
            ok = max(errs.values()) < 1e-3
            bad += not ok
            log(f"smoke N={n}: AttnFuse CP vs eager formula relative L2 {errs} {'ok' if ok else 'WRONG'}")
            row = {"n": n, "impl": "attnfuse_cp", "gpus": dist.get_world_size(), "check_rel_l2": errs}
            row.update(timed(attnfuse_cp_step(case), device, 0.0, 0, distributed=True))
            rows.append(row)
            if dist.get_rank() == 0:
                write(args.out, rows, env, args)
    return bad


# --------------------------------------------------------------------------- main


class Run:
    """The rows measured so far, the budget and where they are written."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.args, self.device = args, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.env = C.environment() if self.rank == 0 else {}
        self.rows: list[dict] = []
        self.t_start = time.perf_counter()

    def over_budget(self) -> bool:
        """Whether the budget is spent (agreed over the ranks, so that they stop together)."""
        return all_max(float(time.perf_counter() - self.t_start > self.args.budget_s), self.device) > 0

    def record(self, row: dict) -> None:
        self.rows.append(row)
        log(f"[{time.perf_counter() - self.t_start:.0f}s] {row}")
        if self.rank == 0:
            write(self.args.out, self.rows, self.env, self.args)


def measure(run: Run, n: int, rope: Any) -> None:
    """Every row of one N."""
    args, device, rank = run.args, run.device, run.rank
    case = Case(n, C.SHAPES["llama"], device, keep_full=rank == 0 and n in args.single_ns)
    base = {"n": n, "gpus": run.world}
    ref = None
    try:
        out = attnfuse_cp_step(case)()
        ref = {"out": out.detach(), **case.grads()}
        del out
        row = {**base, "impl": "attnfuse_cp", **timed(attnfuse_cp_step(case), device, args.target_s, args.warmup,
                                                       distributed=True)}  # fmt: skip
    except Exception as e:  # noqa: BLE001 - recorded
        row = {**base, "impl": "attnfuse_cp", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    run.record(row)
    for backend in [b for b in args.peers.split(",") if b]:
        if run.over_budget():
            return
        impl = f"cp_sdpa_{backend}"
        try:
            row = {**base, "impl": impl, **run_peer(case, backend, args, rope, ref)}
        except Exception as e:  # noqa: BLE001 - recorded
            row = {**base, "impl": impl, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        ref = None  # the correctness check runs once per N, against the first peer
        run.record(row)
        torch.cuda.empty_cache()
    if n not in args.single_ns or run.over_budget():
        return
    for impl in ("attnfuse_1gpu", "sdpa_cudnn_1gpu"):
        if rank == 0:
            try:
                row = {"n": n, "gpus": 1, "impl": impl, **run_single(case, impl, args, rope)}
            except Exception as e:  # noqa: BLE001 - recorded
                row = {"n": n, "gpus": 1, "impl": impl, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            run.record(row)
            torch.cuda.empty_cache()
        dist.barrier()  # the other ranks wait while rank 0 runs alone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ns", default="32768,65536,131072")
    ap.add_argument("--single-ns", default="65536", help="N of the 1-GPU rows (rank 0 alone); '' for none")
    ap.add_argument("--peers", default="cudnn,flash", help="SDPA backends of PyTorch's CP rows")
    ap.add_argument("--rotate", default="allgather", choices=["allgather", "alltoall"])
    ap.add_argument("--target-s", type=float, default=2.0, help="measured seconds per row (>= 3 repetitions)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=170.0, help="no new row starts after this many seconds")
    ap.add_argument(
        "--smoke",
        "--cpu-smoke",
        action="store_true",
        dest="smoke",
        help="CPU: gloo, tiny shapes, interpreter, AttnFuse only",
    )
    args = ap.parse_args()
    args.ns = [32, 64] if args.smoke else [int(x) for x in args.ns.split(",") if x]
    args.single_ns = [int(x) for x in args.single_ns.split(",") if x]
    args.out.mkdir(parents=True, exist_ok=True)
    device = C.init_distributed(args.smoke)
    if args.smoke:
        bad = smoke(args, device)
        dist.destroy_process_group()
        sys.exit(f"smoke: {bad} wrong results" if bad else 0)
    if device.type != "cuda":
        sys.exit("bench_cp.py needs CUDA GPUs (or --smoke)")
    run = Run(args, device)
    C.raise_recompile_limits()
    rope = torch.compile(pre_rope, dynamic=False)
    for n in args.ns:
        if run.over_budget():
            log(f"budget of {args.budget_s:.0f}s spent: stopping before N={n}")
            break
        measure(run, n, rope)
        torch.cuda.empty_cache()
    if run.rank == 0:
        write(args.out, run.rows, run.env, args)
        for n, name, e, t1, t2 in scaling(run.rows):
            log(f"scaling efficiency N={n} {name}: {e:.1%} ({t1:.1f} ms on 1 GPU, {t2:.1f} ms on 2)")
        print((args.out / "cp.md").read_text())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
