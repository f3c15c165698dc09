"""The prelude of every generated module: runtime support that the host `launch`
function calls.

- `_rope_table(key, inv_freq, length, magnitude, device)`: RoPE's cos/sin tables for the
  pre-rotation kernel, built once per table, device and length bucket (`_TABLES`);
- `_freq_table(key, inv_freq, device)`: the inverse frequencies themselves, for kernels that
  rotate at explicit positions;
- `_hadamard_table(d, seed, device)`: attn.hadamard's matrix, built once per device;
- `_kept(make, device)`: tensors those caches keep, allocated outside CUDA-graph memory pools;
- `_launch(kernel, grid, num_warps, num_stages, *args)`: a kernel launch that runs the
  compiled binary directly after its first launch (`_PLANS`, `_BINARIES`; `_driver()`, the
  current device and stream, `_hooked()` and `_c_options()`, which the Gluon kernels' direct
  launches use too);
- `_decode_splits(...)`: the decode kernel's split of the KV cache (its cost model);
- `_empty_ordered(like, shape, dtype, device)`: an output laid out in the dimension order of
  the input `like` (`tl.alloc ... order_of`; `_heads_inner` says which order);
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
    """RoPE's inverse frequencies as a float32 tensor on device, built once per device (what a
    per-call table kernel reads: rotations at explicit positions)."""
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
    """A kernel's launch plan, made at its first launch from which arguments are tensors: a
    function of the arguments that gives (the key of their binary: each tensor's dtype and
    pointer alignment and every other argument's value; the binary's arguments: each tensor
    replaced by its data pointer), written as straight-line code since it runs on every
    call; and the number of arguments."""
    ptrs = [f"a[{i}].data_ptr()" for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    key, passed, n = [], [], 0
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            key += [f"a[{i}].dtype", f"p{n} & 15"]
            passed.append(f"p{n}")
            n += 1
        else:
            key.append(f"a[{i}]")
            passed.append(f"a[{i}]")
    lines = [f"p{j} = {p}" for j, p in enumerate(ptrs)] + [f"return ({', '.join(key)},), ({', '.join(passed)},)"]
    space = {}
    exec("def split(a):\n    " + "\n    ".join(lines), space)
    return space["split"], len(args)


def _launch(kernel, grid, num_warps, num_stages, *args):
    """kernel[grid](*args, num_warps=..., num_stages=...). The first call for given integer
    arguments, tensor dtypes and alignments, and device goes through Triton's launcher, which
    compiles or loads the binary; later calls run that binary directly, without Triton's
    per-call argument binding (tens of microseconds on a slow host), with tensors passed as
    their data pointers, and, for a binary that needs no scratch memory, through Triton's C
    launcher itself. Launch hooks (profilers) and interpreted kernels always take Triton's
    path."""
    if type(kernel) is not triton.runtime.JITFunction or _hooked():
        return _fitting(kernel, grid, num_warps, num_stages, args)
    get_device, get_stream = _driver()
    device = get_device()
    plan = _PLANS.get(id(kernel))
    if plan is None or plan[1] != len(args):
        plan = _PLANS[id(kernel)] = _plan(args)
    try:
        key, passed = plan[0](args)
    except AttributeError:  # another value where this kernel had a tensor: Triton's path
        # (a tensor where it had another value goes into the key as itself: never a wrong hit)
        return kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
    key = (id(kernel), device, num_warps, num_stages, key)
    entry = _BINARIES.get(key)
    if entry is None:
        binary = _fitting(kernel, grid, num_warps, num_stages, args)
        if getattr(binary, "function", None) is not None:
            if len(_BINARIES) >= 1024:
                _BINARIES.clear()
            _BINARIES[key] = _runner(binary)
        return
    direct, run, function, metadata, options = entry
    gx, gy, gz = grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1
    if direct:
        run(gx, gy, gz, get_stream(device), function, *options, metadata, None, None, None, *passed)
    else:
        run(gx, gy, gz, get_stream(device), function, metadata, None, None, None, *passed)


def _hooked():
    """Whether a launch hook (a profiler's) is set: launches then take Triton's own path, which
    calls it."""
    rt = triton.knobs.runtime
    return getattr(rt.launch_enter_hook, "calls", True) or getattr(rt.launch_exit_hook, "calls", True)


def _c_options(run):
    """The arguments Triton's C launcher takes between the kernel function and its metadata, for
    a binary without scratch memory: cooperative grid, PDL, no global or profile scratch (what
    the launcher object `run` would pass)."""
    return run.launch_cooperative_grid, run.launch_pdl, None, None


def _driver():
    """(the current CUDA device's index, the current stream of a device): the getters a direct
    launch uses, looked up once. torch's current_device() re-checks its lazy initialisation on
    every call; a kernel launched here has initialised CUDA already."""
    if not _DRIVER:
        active = triton.runtime.driver.active
        _DRIVER.extend((getattr(torch._C, "_cuda_getDevice", None) or active.get_current_device,
                        active.get_current_stream))
    return _DRIVER


def _runner(binary):
    """How `_launch` runs a compiled binary: (direct, run, function, metadata, options). Direct
    means Triton's C launcher itself (`run.launch`, whose arguments after the stream and function
    start with `options`): for a binary that needs no global or profile scratch memory and takes
    no tensor descriptors, whose launcher object only adds those. Otherwise the launcher object."""
    run = binary.run
    launch = getattr(run, "launch", None)
    direct = (callable(launch) and getattr(launch, "__module__", "") == "__triton_launcher"
              and getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0)
    if direct:
        return True, launch, binary.function, binary.packed_metadata, _c_options(run)
    return False, run, binary.function, binary.packed_metadata, ()


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


def _heads_inner(x):
    """Whether the [B, H, N, D] tensor x has its heads inner to its sequence (a [B, N, H, D]
    tensor through transpose(1, 2), as Hugging Face models hand q over)."""
    if x.is_contiguous():  # the common case first: one cheap check
        return False
    s = x.stride()
    return s[1] < s[2] and x.shape[1] > 1 and x.shape[2] > 1


def _gl_inner(x):
    """Whether an sm90 Gluon kernel reads (writes) the [B, H, N, D] tensor x in place as a
    [B * N, H * D] view: x is a contiguous [B, N, H, D] tensor seen through transpose(1, 2), as
    transformers hands q, k and v over and as `_empty_ordered` lays out an output for such a q."""
    return _heads_inner(x) and x.transpose(1, 2).is_contiguous() and x.data_ptr() % 16 == 0


def _empty_ordered(like, shape, dtype, device):
    """torch.empty(shape) for a [B, H, N, D] output, its heads inner to its sequence when those
    of the input `like` are (`_heads_inner`): then out.transpose(1, 2) is contiguous, as SDPA's
    output is for such a query, and the caller's reshape to [B, N, H·D] copies nothing."""
    if _heads_inner(like):
        return torch.empty((shape[0], shape[2], shape[1], shape[3]), dtype=dtype, device=device).transpose(1, 2)
    return torch.empty(shape, dtype=dtype, device=device)


def _cdiv(a, b):
    """ceil(a / b) for the launch grids (triton.cdiv is a constexpr function: microseconds per
    host call)."""
    return -(-a // b)
