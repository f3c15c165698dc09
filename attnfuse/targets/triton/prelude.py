"""The prelude of every generated module: runtime support that the host `launch`
function calls.

- `_rope_table(key, inv_freq, length, magnitude, device)`: RoPE's cos/sin tables for the
  pre-rotation kernel, built once per table, device and length bucket (`_TABLES`);
- `_freq_table(key, inv_freq, device)`: the inverse frequencies themselves, for kernels that
  rotate at explicit positions;
- `_hadamard_table(d, seed, device)`: attn.hadamard's matrix, built once per device;
- `_kept(make, device)`: tensors those caches keep, allocated outside CUDA-graph memory pools;
- `_launch(kernel, grid, num_warps, num_stages, *args)`: a kernel launch that runs the
  compiled binary directly after its first launch (`_BINARIES`, `_DRIVER`);
- `_decode_splits(...)`: the decode kernel's split of the KV cache (its cost model);
- `_cdiv(a, b)`: the grids' ceiling division.

Generated modules must stay standalone (a cached kernel file is all that is imported), so
the printer copies this file's code, everything after its imports, into each of them
(`printer.prelude_source`); the printed module imports torch and triton itself. Here the
same code is an ordinary module, linted and unit-tested. The printer reads this file as
text and never imports it, so that printing does not import torch.
"""

# triton.knobs and the CUDA driver's device/stream getters are real in Triton 3.6 but missing
# from its type information.
# pyright: reportAttributeAccessIssue=false

import operator

import torch
import triton

# The code below is copied verbatim into generated modules; its hand layout is kept so
# that generated modules stay byte-identical to earlier ones.
# fmt: off
_TABLES = {}


def _rope_table(key, inv_freq, length, magnitude, device):
    """(cos, sin) float32 [positions, len(inv_freq)] for positions 0.. the next power of two
    >= length, scaled by magnitude; built once per device and length bucket."""
    n = 1 << max(int(length) - 1, 0).bit_length()
    t = _TABLES.get((key, n, device))
    if t is None:
        freqs = torch.tensor(inv_freq, dtype=torch.float64)
        angle = torch.arange(n, dtype=torch.float64)[:, None] * freqs[None, :]
        t = _TABLES[(key, n, device)] = _kept(lambda: (
            (angle.cos() * magnitude).to(device=device, dtype=torch.float32).contiguous(),
            (angle.sin() * magnitude).to(device=device, dtype=torch.float32).contiguous(),
        ), device)
    return t


def _freq_table(key, inv_freq, device):
    """RoPE's inverse frequencies as a float32 tensor on device, built once per device (for
    kernels that compute cos and sin themselves: rotations at explicit positions)."""
    t = _TABLES.get((key, device))
    if t is None:
        t = _TABLES[(key, device)] = _kept(lambda: torch.tensor(inv_freq, dtype=torch.float32, device=device), device)
    return t


def _hadamard_table(d, seed, device):
    """attn.hadamard's matrix M = diag(signs) H / sqrt(d) (x @ M) as its parts, built once per
    device: H, Sylvester's Hadamard matrix (float16 [d, d] of ±1, exact), and the signs drawn from
    torch's CPU generator seeded with seed (float32 [d]), as `attnfuse.low_precision`'s."""
    t = _TABLES.get(("hadamard", d, seed, device))
    if t is None:
        signs = torch.randint(0, 2, (d,), generator=torch.Generator().manual_seed(seed)) * 2 - 1
        h = torch.ones(1, 1)
        while h.shape[0] < d:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        t = _TABLES[("hadamard", d, seed, device)] = _kept(lambda: (
            h.to(device=device, dtype=torch.float16).contiguous(),
            signs.to(device=device, dtype=torch.float32).contiguous(),
        ), device)
    return t


_KEEPER = []


def _kept(make, device):
    """make(), for tensors a cache keeps, allocated outside any CUDA-graph memory pool:
    torch.compile's CUDA-graph warm-up routes the calling thread's allocations into the graph's
    pool, which may hold no tensor that outlives the graph. On a CUDA device make runs on a
    helper thread, whose allocations are its own, and its stream is synchronised before the
    tensors are used (except during a capture itself, where make runs as it is)."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    if not _KEEPER:
        import concurrent.futures

        _KEEPER.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="attnfuse-kept"))

    def run():
        with torch.cuda.device(device):
            made = make()
            torch.cuda.current_stream().synchronize()
        return made

    return _KEEPER[0].submit(run).result()


_BINARIES = {}
_DRIVER = []
_PLANS = {}


def _plan(args):
    """Getters of a launch's non-tensor arguments (their values go into the key) and of its
    tensors (their dtype and alignment do), by position: the same for every call of a kernel."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    others = [i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
    return (operator.itemgetter(*others) if others else lambda a: (),
            operator.itemgetter(*tensors) if len(tensors) > 1 else lambda a, i=tuple(tensors): [a[j] for j in i],
            len(args))


def _launch(kernel, grid, num_warps, num_stages, *args):
    """kernel[grid](*args, num_warps=..., num_stages=...). The first call for given integer
    arguments, tensor dtypes and alignments, and device goes through Triton's launcher, which
    compiles or loads the binary; later calls run that binary directly, without Triton's
    per-call argument binding (tens of microseconds on a slow host). Launch hooks (profilers)
    and interpreted kernels always take Triton's path."""
    rt = triton.knobs.runtime
    if (type(kernel) is not triton.runtime.JITFunction or getattr(rt.launch_enter_hook, "calls", True)
            or getattr(rt.launch_exit_hook, "calls", True)):
        return _fitting(kernel, grid, num_warps, num_stages, args)
    if not _DRIVER:
        active = triton.runtime.driver.active
        # torch's current_device() re-checks its lazy initialisation on every call; a kernel
        # launched here has initialised CUDA already.
        _DRIVER.extend((getattr(torch._C, "_cuda_getDevice", None) or active.get_current_device,
                        active.get_current_stream))
    device = _DRIVER[0]()
    plan = _PLANS.get(id(kernel))
    if plan is None or plan[2] != len(args):
        plan = _PLANS[id(kernel)] = _plan(args)
    try:
        key = (id(kernel), device, num_warps, num_stages, plan[0](args),
               *[(t.dtype, t.data_ptr() & 15) for t in plan[1](args)])
    except AttributeError:  # another value where this kernel had a tensor: Triton's path
        # (a tensor where it had another value goes into the key as itself: never a wrong hit)
        return kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
    entry = _BINARIES.get(key)
    if entry is None:
        binary = _fitting(kernel, grid, num_warps, num_stages, args)
        if getattr(binary, "function", None) is not None:
            if len(_BINARIES) >= 1024:
                _BINARIES.clear()
            _BINARIES[key] = (binary.run, binary.function, binary.packed_metadata)
        return
    run, function, metadata = entry
    run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
        _DRIVER[1](device), function, metadata, None, None, None, *args)


_STAGES = {}


def _fitting(kernel, grid, num_warps, num_stages, args):
    """kernel[grid](*args) with `num_stages` software-pipeline stages, or fewer where that many
    need more shared memory than the GPU has (the tiling table's choice can overshoot on a
    variant whose loop holds more, a custom mask's extra tensors say): a slower kernel, not
    a failed call. The stages that fit are remembered per kernel and configuration."""
    key = (id(kernel), num_warps, num_stages)
    stages = _STAGES.get(key, num_stages)
    while True:
        try:
            binary = kernel[grid](*args, num_warps=num_warps, num_stages=stages)
        except triton.runtime.errors.OutOfResources as e:
            if stages <= 1 or getattr(e, "name", "shared memory") != "shared memory":
                raise
            stages -= 1
            continue
        _STAGES[key] = stages
        return binary


_SMS = {}


def _decode_splits(rows, length, block_n, waves, min_keys, fixed, device):
    """(splits, keys per split) of a decode launch over a cache of `length` keys for `rows`
    (batch x KV heads) programs: `fixed` splits, or enough to fill `waves` programs per SM, at most
    one per `min_keys` keys; never more than the cache's blocks of `block_n` keys, and each split
    a whole number of blocks (the interpreter counts 4 SMs)."""
    blocks = max(-(-length // block_n), 1)
    splits = fixed
    if not splits:
        sms = _SMS.get(device)
        if sms is None:
            cuda = device.type == "cuda"
            sms = _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4
        splits = min(-(-waves * sms // max(rows, 1)), -(-length // min_keys))
    per = -(-blocks // max(1, min(splits, blocks))) * block_n
    return -(-max(length, 1) // per), per


def _cdiv(a, b):
    """ceil(a / b) for the launch grids (triton.cdiv is a constexpr function: microseconds per
    host call)."""
    return -(-a // b)
