"""kernel-path: which kernels compute a variant's attention, forward or backward, on its target.

`gluon-sm90`: on Hopper, the warp-specialized Gluon kernel (TMA loads, asynchronous wgmma,
ping-pong consumer warpgroups; `attnfuse/targets/triton/gluon_sm90.py`), with K's transforms in a
pre-rotation kernel and Q's applied by the kernel itself (QK-norm, a plain RoPE:
`gluon_rotates_q`) or in a pre-rotation kernel too. The generic Triton kernel is still generated beside it,
and the launcher takes it for calls the Gluon kernel does not cover (Nq != Nk, a length not
a multiple of 128 or below `min-len`, unaligned data).

`gluon-sm90` on a backward function (attn-autodiff's): the sm90 Gluon backward
(`attnfuse/targets/triton/gluon_bwd_sm90.py`): a dK/dV kernel (one program per 128 keys, K and V
resident, Q and dO streamed by a TMA producer warp, two consumer warpgroups) that also adds dQ's
shares into an fp32 workspace by TMA reduce-adds (`dq = "reduce"`, option `dq-reduce`), or, with
`dq-reduce=false` or under `torch.use_deterministic_algorithms(True)`, the dK/dV kernel and then an
ordered dQ kernel (one program per 128 query rows, K and V streamed: bitwise reproducible), Q and K
pre-rotated, their chains' derivatives in small kernels after them; the generic backward stays
beside it for calls it does not cover. It takes every variant the Gluon forward takes, at head dims
64 and 128 (whatever `head-dims` says: that option is the forward's), for a function that asks for
dq, dk and dv. Measured (H200, 2026-12-02, benchmarks/results/h200/run_2026-12-02_gluon_bwd/):
1.11-2.08x the generic backward at N = 4096 and 16384 for causal, RoPE+causal and window+softcap,
at the Llama and the paper shapes. dQ by reduce-adds (FlashAttention-3's way, a writer warp issuing
them; not bitwise reproducible) measured 1.01-1.11x the ordered dQ kernel's speed at the Llama
shape and 1.07-1.18x at the paper shape, N = 4096-16384 (run_2026-12-03_bwd_lse_tma), so it is the
default. Min-len is `min-len` (a backward pre-rotates Q and K on both paths); below 2048 the Gluon
backward was not measured.

`decode` (option `decode`): a forward compiled for decoding against a KV cache
(`Variant.decode`): a split-KV (flash-decoding) kernel over the cache, all query heads of one KV
head packed into one tile so K and V are read once, then a combine kernel through the lse
(`decode_to_tl`). Generic Triton, so it serves every GPU and the interpreter. The entry records
the cache's layout (`page_size`: 0 for a contiguous cache [B, Hkv, S, D], else the page size of a
paged pool [pages, page_size, Hkv, D]) and the split cost model: the launcher gives each (batch,
KV head) `splits` programs, `cdiv(waves x SMs, B x Hkv)`, at most one per `min_split_keys` keys
of the cache and per block of keys (or the option's fixed `splits`).

`varlen` (option `varlen`): a forward or backward over packed sequences of different lengths
(`Variant.varlen`): the generic kernels, their programs per sequence, each sequence computed
alone (`varlen_to_tl`).

`fp8` (a forward in the FP8 form: q and k, and maybe v, end in attn.quantize): quantization
kernels first, one per quantized operand (its transforms, then e4m3 values and one scale per
block; a per-tensor scale takes a maxima kernel, the largest of them on the host, then the
quantization), then the generic forward reading e4m3 tiles and their scales (`fp8_to_tl`).
`mma = "e4m3"` on GPUs with FP8 tensor cores (sm 89 and up): the products take e4m3 operands
(P rounded to e4m3 too, after scaling by 2^8); `mma = "f32"` elsewhere (the interpreter, whose
e4m3 dot is wrong, and older GPUs): the same e4m3 values multiplied in fp32. On sm 90,
`kernel = "gluon-sm90"` with its `min_len`: the attention kernel is the sm90 Gluon kernel on
e4m3 tiles (`gluon_sm90.attn_fwd_sm90` with `fp8_scales`) for calls it covers (Nq = Nk, a
multiple of 128, at least min_len), the generic FP8 kernel otherwise; it takes q, k and v all
quantized, head dim 64 or 128, a causal mask or none (a sink too), q's scales per a multiple of
64 rows and k's and v's per the same multiple of 128 keys (or per tensor).

`triton`: the generic kernel only; the attribute says why (another GPU, the interpreter, a
head dim or dtype the Gluon kernel does not take or is not faster for, a backward that does not
ask for all of dq, dk and dv).

`tanh = "approx"`: the variant's tanh (a softcap, `math.tanh` in a region) runs as the GPU's
approximate instruction (`tl.fast_tanh`, `tanh.approx.f32`, relative error about 2^-11, as
FlashAttention's softcap) instead of 2·sigmoid(2x) - 1, in every kernel of the function;
`tanh = "approx-gluon"`: in the Gluon kernel's score functions only (its generic fallback keeps
the exact form). Option `tanh`: `auto` (the default) gives approx-gluon where the Gluon kernel is
chosen (there, within the Gluon kernel, the approximate instruction measured 1.64-1.96x faster than
the exact sigmoid form on the softcap, Gemma 2 and tanh score_mod families; the Gluon kernel with it
is 1.47-1.64x the generic kernel, which keeps the exact form; within the generic kernel the
instruction measured 1.12-1.43x forward and 1.01-1.38x backward, H200 2026-12-02,
`benchmarks/tanh_approx.py`); `approx` gives approx,
forward and backward; `exact` neither. Never for the interpreter, which cannot run it, nor for
f32 inputs.

What the Gluon kernel takes: bf16/fp16, head dim 64, 128 or 256 (q, k and v alike; at 256 its K/V
blocks are 64 keys in a 2-deep ring), any forward
variant: a causal mask or none it applies itself; other masks, biases, softcap and score_mod
reach it as generated functions (convert-attn-to-tl's `tl.device_fn`s: the KV range and the
score ops), a sink in its epilogue. Where it is chosen is measured (H200, 2026-12-01,
benchmarks/results/h200/run_2026-12-01_gluon/ and run_2026-12-01_families/):
- head dim 128 (the Llama-3 shape): 1.24-1.39x the generic kernel for causal and RoPE+causal,
  1.03-1.17x cuDNN (with a separate RoPE for RoPE variants); 1.12-1.58x the generic kernel for
  every other family measured (windows, prefix-LM, documents, ALiBi, sinks, softcap and
  score_mods, with tanh by the approximate instruction);
- head dim 256 (Gemma-2-9B's shape, H200 2026-12-02, run_2026-12-02_d256/): 1.81-1.98x the
  generic kernel for causal, 1.85-2.05x for RoPE+causal, 2.22x for softcap + window 4096, from
  N = 2048 (and 0.84-1.10x cuDNN; since K and V blocks are released apart in its ring,
  2.2-2.7x the generic kernel and 1.07-1.48x cuDNN for causal at N = 1024-16384,
  run_2026-12-04_kv_release/);
- head dim 64 (the paper shape, H200 2026-12-02, run_2026-12-02_d64/): three consumer
  warpgroups over 192-row Q tiles (FlashAttention-3's schedule), 1.10-1.16x the generic kernel
  for causal from N = 2048 and 1.18-1.27x for RoPE + causal from 4096 (0.92-1.00x cuDNN). Two
  ping-pong warpgroups over 128 rows had measured 0.93-1.10x the generic kernel;
- N = 2048 with Q transforms in a pre-rotation kernel: host-bound (three launches and four TMA
  descriptors for 0.1 ms of GPU work), 0.69-0.77x the generic kernel in one of three runs, hence
  `min-len-transformed`; with Q's RoPE in the kernel (two launches) 1.29x at N = 2048;
- short sequences (H200, 2026-12-03, run_2026-12-03_short/, after the host path lost most of its
  cost): at head dim 128 the Gluon kernel is 1.39-1.51x the generic kernel for causal from
  N = 512 (1.27-1.47x with RoPE), hence `min-len-fwd`; at head dim 64 0.90-0.97x at N = 1024 with
  192-row tiles, 1.11-1.36x with two warpgroups over 128 rows (its schedule up to N = 2048 since);
  at head dim 256 1.88-2.0x (run_2026-12-03_short_d64_d256), so `min-len-fwd` covers every head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from xdsl.context import Context
from xdsl.dialects import math
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseArrayBase,
    DictionaryAttr,
    Float16Type,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn
from attnfuse.passes.analysis import AttentionChains, analyse, check_sm, target_option, variant_funcs

GLUON = "gluon-sm90"
TRITON = "triton"
DECODE = "decode"
VARLEN = "varlen"
FP8 = "fp8"
TanhMode = Literal["auto", "approx", "exact"]
"""kernel-path's `tanh` option (see the module docstring)."""
GLUON_BLOCK = 128
"""Rows of the Gluon kernel's Q tiles and K/V blocks."""
GLUON_BWD_BLOCK = 64
"""Rows of one step of the Gluon backward kernels' loops: query rows in the dK/dV kernel (its
programs own 128 keys), keys in the dQ kernel (its programs own 128 query rows)."""
DECODE_WAVES = 2
"""The decode cost model's programs per SM: splits fill `DECODE_WAVES x SMs` programs."""
DECODE_MIN_SPLIT_KEYS = 256
"""The fewest cache keys a decode split reads (a shorter split costs more in the combine than it
saves)."""
GLUON_FORWARD_HEAD_DIMS = (64, 128, 256)
"""Head dims the Gluon forward compiles for (at 256: 64-key blocks in a 2-deep ring)."""
GLUON_HEAD_DIMS = (64, 128, 256)
"""Head dims the Gluon forward is chosen for: every one it takes (measured faster than the
generic kernel at each; see the module docstring)."""


def gluon_refusal(
    v: AttentionChains, sm: int, seq_len: int, min_len: int, head_dims: tuple[int, ...] = GLUON_HEAD_DIMS
) -> str | None:
    """Why the sm90 Gluon kernel cannot compute `v` (None: it can)."""
    if sm != 90:
        return f"sm {sm}: the Gluon kernel is for sm 90 (Hopper)"
    if v.is_backward:
        wrt = v.func.attributes.get("attn.wrt")
        asked = set(wrt.get_values()) if isinstance(wrt, DenseArrayBase) else set()
        if not {v.q_arg.index, v.k_arg.index, v.v_arg.index} <= asked:
            return "a backward that does not ask for dq, dk and dv (the Gluon backward computes them together)"
        head_dims = (64, 128)
    types = {t.get_element_type() for t in (v.q_type, v.k_type, v.v_type)}
    if len(types) != 1 or not isinstance(next(iter(types)), BFloat16Type | Float16Type):
        return "q, k and v are not all bf16 or all f16"
    dims = {t.get_shape()[3] for t in (v.q_type, v.k_type, v.v_type)}
    takes = (64, 128) if v.is_backward else GLUON_FORWARD_HEAD_DIMS
    if len(dims) != 1 or next(iter(dims)) not in takes:
        takes_text = ", ".join(map(str, takes[:-1])) + f" or {takes[-1]}"
        return f"head dims {sorted(dims)}: the Gluon kernel takes {takes_text}, the same for q, k and v"
    if next(iter(dims)) not in head_dims:
        return f"head dim {next(iter(dims))}: not among kernel-path's head-dims {list(head_dims)}"
    if seq_len < min_len:
        return f"compiled for N <= {seq_len}, below the Gluon kernel's min-len {min_len}"
    return None


def gluon_rotates_q(v: AttentionChains) -> bool:
    """Whether the Gluon kernel applies Q's transforms itself: an RMSNorm (QK-norm), a RoPE of
    the `half` style over every channel (from the launcher's cos/sin tables: by position, or
    computed per call for explicit positions or an inv_freq tensor), or the norm then the RoPE.
    Other Q transforms run in a pre-rotation kernel before it."""
    chain = list(v.q_chain)
    if chain and isinstance(chain[0], attn.NormOp):
        chain = chain[1:]
    if not chain:
        return bool(v.q_chain)
    return (
        len(chain) == 1 and isinstance(rope := chain[0], attn.RopeOp) and rotates_halves(rope, v.q_type.get_shape()[3])
    )


def rotates_halves(rope: attn.RopeOp, d: int) -> bool:
    """Whether `rope` pairs channel c with c + d/2 over all d channels (the `half` style, every
    channel rotated): the RoPE that the Gluon kernels apply to Q and undo on dK themselves."""
    return rope.style.data.value == "half" and rope.rotary_dim.value.data == d


def computes_tanh(f: object) -> bool:
    """Whether function `f` computes a tanh: a softcap, or `math.tanh` in a region."""
    return any(isinstance(o, attn.SoftcapOp | math.TanhOp) for o in f.walk())  # type: ignore[attr-defined]


def uses_approx_tanh(f: object, gluon: bool) -> bool:
    """Whether this pass chose the approximate tanh instruction for function `f`'s Gluon
    kernel functions (`gluon`) or for its generic kernels."""
    entry = getattr(f, "attributes", {}).get("attn.kernel_path")
    if not isinstance(entry, DictionaryAttr) or "tanh" not in entry.data:
        return False
    return entry.data["tanh"] == StringAttr("approx") or (gluon and entry.data["tanh"] == StringAttr("approx-gluon"))


def kernel_path(f: object) -> tuple[str, int]:
    """(path, min_len) recorded on a function by this pass; ("triton", 0) when absent."""
    attrs = getattr(f, "attributes", {})
    entry = attrs.get("attn.kernel_path")
    own = (StringAttr(DECODE), StringAttr(VARLEN), StringAttr(FP8))
    if isinstance(entry, DictionaryAttr) and entry.data["path"] in own:
        return entry.data["path"].data, 0  # type: ignore[attr-defined]
    if not isinstance(entry, DictionaryAttr) or entry.data["path"] != StringAttr(GLUON):
        return TRITON, 0
    return GLUON, entry.data["min_len"].value.data  # type: ignore[attr-defined]


@dataclass(frozen=True)
class DecodeConfig:
    """A decode function's `attn.kernel_path` entries (see the module docstring)."""

    page_size: int
    """0: a contiguous cache [B, Hkv, S, D]; else the page size of a paged pool."""
    waves: int
    min_split_keys: int
    splits: int
    """A fixed number of splits per (batch, KV head); 0: the cost model's."""


def decode_config(f: object) -> DecodeConfig:
    """The decode entries of function `f`'s `attn.kernel_path` (`checked_kernel_path` checked them)."""
    entry = getattr(f, "attributes", {}).get("attn.kernel_path")
    assert isinstance(entry, DictionaryAttr)

    def get(name: str) -> int:
        a = entry.data.get(name)
        return a.value.data if isinstance(a, IntegerAttr) else 0

    return DecodeConfig(get("page_size"), get("waves"), get("min_split_keys"), get("splits"))


def fp8_gluon_min_len(f: object) -> int | None:
    """The min_len of function `f`'s FP8 Gluon kernel (`kernel = "gluon-sm90"`), or None."""
    entry = getattr(f, "attributes", {}).get("attn.kernel_path")
    if not isinstance(entry, DictionaryAttr) or entry.data.get("kernel") != StringAttr(GLUON):
        return None
    min_len = entry.data.get("min_len")
    return min_len.value.data if isinstance(min_len, IntegerAttr) else None


def multiplies_e4m3(f: object) -> bool:
    """Whether this pass gave function `f`'s FP8 kernel e4m3 products (`mma = "e4m3"`)."""
    entry = getattr(f, "attributes", {}).get("attn.kernel_path")
    return isinstance(entry, DictionaryAttr) and entry.data.get("mma") == StringAttr("e4m3")


def reduces_dq(f: object) -> bool:
    """Whether this pass gave function `f`'s Gluon backward dQ by TMA reduce-adds (`dq-reduce`)."""
    entry = getattr(f, "attributes", {}).get("attn.kernel_path")
    return isinstance(entry, DictionaryAttr) and entry.data.get("dq") == StringAttr("reduce")


def checked_kernel_path(v: AttentionChains, sm: int) -> tuple[str, int]:
    """`kernel_path` of `v`'s function, checked against the function and the target `sm`: an
    `attn.kernel_path` written by hand (or left from another target) must name a known path,
    give the Gluon kernel only a function it takes on sm 90 (q, k and v all bf16 or all f16; one
    head dim, 64, 128 or 256, 64 or 128 for a backward; an integer min_len of at least 128), and
    its approximate tanh only to bf16/f16 inputs on a GPU. A DiagnosticException names the function and what
    is wrong."""
    f = v.func
    where = f"func @{f.sym_name.data}: attn.kernel_path"
    entry = f.attributes.get("attn.kernel_path")
    if entry is None:
        return _unmarked(v)
    path = entry.data.get("path") if isinstance(entry, DictionaryAttr) else None
    if not isinstance(path, StringAttr) or path.data not in (GLUON, TRITON, DECODE, VARLEN, FP8):
        raise DiagnosticException(
            f'{where} must be a dictionary with path = "{GLUON}", "{TRITON}", "{DECODE}", "{VARLEN}" or "{FP8}", '
            f"got {entry}"
        )
    assert isinstance(entry, DictionaryAttr)
    if _checked_fp8(v, path.data, entry, sm, where):
        return FP8, 0
    _check_tanh(v, entry, sm, where)
    dq = entry.data.get("dq")
    if dq is not None and (dq != StringAttr("reduce") or not v.is_backward or path.data != GLUON):
        raise DiagnosticException(f'{where} dq = {dq}: only a backward on "{GLUON}" takes dq = "reduce"')
    if path.data == TRITON:
        return TRITON, 0
    if path.data == VARLEN:
        return VARLEN, 0
    if path.data == DECODE:
        _check_decode(v, entry, where)
        return DECODE, 0
    min_len = entry.data.get("min_len")
    if not isinstance(min_len, IntegerAttr) or min_len.value.data < GLUON_BLOCK:
        raise DiagnosticException(f"{where} says {GLUON} with min_len {min_len}: expected an integer >= {GLUON_BLOCK}")
    n = min_len.value.data
    reason = gluon_refusal(v, sm, n, n, GLUON_FORWARD_HEAD_DIMS)
    if reason is not None:
        raise DiagnosticException(
            f"{where} says {GLUON}, but the Gluon kernel cannot compute it: {reason} (run kernel-path to choose)"
        )
    return GLUON, n


def quantizes(v: AttentionChains) -> bool:
    """Whether function `v` is in the FP8 form: an attn.quantize on q, k or v."""
    return any(isinstance(op, attn.QuantizeOp) for op in v.low_precision)


def _unmarked(v: AttentionChains) -> tuple[str, int]:
    """The path of a function kernel-path has not marked: the generic kernel, unless it is in the
    FP8 form (whose kernels kernel-path chooses)."""
    if quantizes(v):
        raise DiagnosticException(f"func @{v.func.sym_name.data} is in the FP8 form: run kernel-path first")
    return TRITON, 0


def _checked_fp8(v: AttentionChains, path: str, entry: DictionaryAttr, sm: int, where: str) -> bool:
    """Whether an entry's path is "fp8", checked: exactly the functions in the FP8 form take it,
    and e4m3 products only GPUs that have them (sm 89 and up)."""
    if (path == FP8) != quantizes(v):
        raise DiagnosticException(
            f'{where} says "{path}", but the function is {"" if quantizes(v) else "not "}in the FP8 form: '
            f'the "{FP8}" path takes exactly the functions whose q and k end in attn.quantize'
        )
    if path == FP8:
        fp8_refusal(v, entry, where)
        if entry.data.get("mma") == StringAttr("e4m3") and sm < 89:
            raise DiagnosticException(f'{where} says mma = "e4m3", but sm {sm} has no e4m3 tensor cores: "f32"')
    return path == FP8


def fp8_gluon_refusal(v: AttentionChains, sm: int) -> str | None:
    """Why the sm90 Gluon kernel cannot be the attention kernel of `v` in the FP8 form (None: it can)."""
    if sm != 90:
        return f"sm {sm}: the Gluon kernel is for sm 90 (Hopper)"
    q_block, k_block, v_block = (
        c[-1].block.value.data if c and isinstance(c[-1], attn.QuantizeOp) else None
        for c in (v.q_chain, v.k_chain, v.v_chain)
    )
    if v_block is None:
        return "v is not quantized (the Gluon FP8 kernel multiplies e4m3 P by e4m3 v)"
    if q_block is None or q_block % 64 or k_block is None or k_block % 128 or k_block != v_block:
        return (
            f"scale blocks q {q_block}, k {k_block}, v {v_block}: it takes q's per a multiple of 64 rows, "
            "k's and v's alike per a multiple of 128 (0: per tensor)"
        )
    dims = {t.get_shape()[3] for t in (v.q_type, v.v_type)}
    if dims not in ({64}, {128}):
        return f"head dims {sorted(dims)}: it takes 64 or 128, the same for q and v"
    if any(not (isinstance(op, attn.MaskOp) and op.kind.data == "causal") for op in v.score_ops):
        return "score ops other than a causal mask (the Gluon FP8 kernel has no score functions)"
    return None


def fp8_refusal(v: AttentionChains, entry: DictionaryAttr | None, where: str) -> None:
    """Refuse what the `fp8` path cannot lower (a DiagnosticException naming it): a backward, q
    and k not both quantized, a head dim that is not a power of two from 16 (32 for e4m3
    products), an `mma` other than "e4m3" or "f32"."""
    if v.is_backward:
        raise DiagnosticException(f"{where}: the FP8 form is forward-only (inference); it has no backward")
    q8, k8 = (bool(c) and isinstance(c[-1], attn.QuantizeOp) for c in (v.q_chain, v.k_chain))
    if not (q8 and k8):
        which = "q" if k8 else "k" if q8 else "q and k"
        raise DiagnosticException(
            f"{where}: the FP8 kernel multiplies e4m3 q by e4m3 k, but {which} is not quantized "
            "(end both chains in attn.quantize, or run the variant with af.backend('reference'))"
        )
    mma = entry.data.get("mma") if entry is not None else StringAttr("e4m3")
    if mma not in (StringAttr("e4m3"), StringAttr("f32")):
        raise DiagnosticException(f'{where} mma must be "e4m3" or "f32", got {mma}')
    if entry is not None and "kernel" in entry.data:
        _check_fp8_gluon(v, entry, mma, where)
    least = 32 if mma == StringAttr("e4m3") else 16
    dims = sorted({t.get_shape()[3] for t in (v.q_type, v.v_type)})
    if any(d < least or d & (d - 1) for d in dims):
        raise DiagnosticException(
            f"{where}: the FP8 kernel takes head dims that are powers of two from {least}, got {dims}"
        )


def _check_fp8_gluon(v: AttentionChains, entry: DictionaryAttr, mma: Attribute | None, where: str) -> None:
    """An FP8 entry's `kernel = "gluon-sm90"`: with an integer min_len, e4m3 products, a variant it takes."""
    if entry.data["kernel"] != StringAttr(GLUON) or not isinstance(entry.data.get("min_len"), IntegerAttr):
        raise DiagnosticException(f'{where} kernel must be "{GLUON}" with an integer min_len')
    why = fp8_gluon_refusal(v, 90) or (None if mma == StringAttr("e4m3") else f"mma = {mma}")
    if why is not None:
        raise DiagnosticException(f"{where} says {GLUON}, but the Gluon FP8 kernel cannot compute it: {why}")


def _check_tanh(v: AttentionChains, entry: DictionaryAttr, sm: int, where: str) -> None:
    """An entry's tanh: "approx" or "approx-gluon", for bf16/f16 inputs on a GPU."""
    tanh = entry.data.get("tanh")
    if tanh is None:
        return
    if tanh not in (StringAttr("approx"), StringAttr("approx-gluon")):
        raise DiagnosticException(f'{where} tanh must be "approx" or "approx-gluon", got {tanh}')
    if sm == 0 or not isinstance(v.q_type.get_element_type(), BFloat16Type | Float16Type):
        raise DiagnosticException(
            f"{where} says tanh = {tanh}, but the approximate tanh instruction needs bf16/f16 inputs on a "
            f"GPU, got {v.q_type.get_element_type()} at sm {sm}"
        )


def _check_decode(v: AttentionChains, entry: DictionaryAttr, where: str) -> None:
    """A decode entry: a forward function; a page size of 0 or a power of two from 16 to 256;
    positive waves and min_split_keys; splits of 0 (the cost model) or more."""
    if v.is_backward:
        raise DiagnosticException(f'{where} says "{DECODE}" for a backward function: decoding is forward-only')
    bad = [k for k in entry.data if k not in ("path", "page_size", "waves", "min_split_keys", "splits", "tanh")]
    if bad:
        raise DiagnosticException(f'{where} "{DECODE}" has unknown entries {bad}')
    values = {}
    for name in ("page_size", "waves", "min_split_keys", "splits"):
        a = entry.data.get(name)
        if not isinstance(a, IntegerAttr):
            raise DiagnosticException(f'{where} "{DECODE}" needs an integer {name}, got {a}')
        values[name] = a.value.data
    page = values["page_size"]
    if page != 0 and (page < 16 or page > 256 or page & (page - 1)):
        raise DiagnosticException(
            f"{where} page_size must be 0 (contiguous) or a power of two in [16, 256], got {page}"
        )
    if values["waves"] < 1 or values["min_split_keys"] < 1 or values["splits"] < 0:
        raise DiagnosticException(f"{where} needs waves >= 1, min_split_keys >= 1 and splits >= 0, got {values}")


@dataclass(frozen=True)
class KernelPathPass(ModulePass):
    """Choose, per function (forward or backward), the kernels that compute its attention: the
    sm90 Gluon kernels where they take the variant, else the generic Triton kernels. Marks the
    function with `attn.kernel_path`: `{path = "gluon-sm90", min_len = N}` or `{path = "triton",
    reason = "..."}`, plus `tanh = "approx"` or `"approx-gluon"` where the variant's tanh
    runs as the GPU's approximate instruction, and `dq = "reduce"` on a Gluon backward whose dQ
    is added up by TMA reduce-adds (`dq-reduce`). With `decode`: `{path = "decode", page_size,
    waves, min_split_keys, splits}` (the decode kernels and their split cost model); with
    `varlen`: `{path = "varlen", reason}`; a forward in the FP8 form: `{path = "fp8", mma, reason}`,
    with `kernel = "gluon-sm90"` and `min_len` where the sm90 Gluon kernel takes its attention."""

    name = "kernel-path"

    sm: int | None = None
    """Target SM version; default: the module's attn.target, else 90."""
    seq_len: int | None = None
    """Sequence length the kernel is compiled for; default: attn.target, else 4096."""
    gluon: bool = True
    """false: always the generic Triton kernel (the baseline the Gluon path is measured against)."""
    head_dims: tuple[int, ...] = GLUON_HEAD_DIMS
    """Head dims the Gluon forward is chosen for (among 64, 128 and 256; default: all three, each
    measured faster than the generic kernel)."""
    min_len: int = 2048
    """Shortest sequence the Gluon kernels run for a variant without Q transforms (shorter
    calls are launch-bound: the generic kernel's direct launch costs less host time)."""
    min_len_fwd: int = 512
    """The forward's min-len when it is below `min_len` (the smaller of the two applies), for a
    variant without a pre-rotation kernel: with the host path of 2026-12-03 the Gluon forward
    measured, against the generic kernel at N = 512-2048, 1.39-1.51x for causal at the Llama
    shape (head dim 128), 1.16-1.29x at the paper shape (64, two warpgroups up to N = 2048) and
    1.88-2.0x at Gemma 2's (256); for RoPE + causal 1.27-1.47x, 1.11-1.36x and 1.17-2.04x (H200,
    run_2026-12-03_short and run_2026-12-03_short_d64_d256). The backward keeps `min_len` (not
    measured below 2048)."""
    min_len_transformed: int = 4096
    """The same for a variant whose Q transforms need a pre-rotation kernel before the Gluon
    kernel (all but QK-norm and a plain RoPE, which it applies itself: `gluon_rotates_q`): at N = 2048
    such calls were host-bound on the H200's host, 0.69-0.77x the generic kernel in one of three
    runs (1.17-1.20x in the other two)."""
    tanh: TanhMode = "auto"
    """A bf16/f16 variant's tanh on a GPU: `auto`, by the approximate instruction in the Gluon
    kernel only; `approx`, in every kernel (forward and backward); `exact`, nowhere."""
    dq_reduce: bool = True
    """The Gluon backward's dQ by TMA reduce-adds from its dK/dV kernel (each block of keys adds
    its share into an fp32 workspace: not bitwise reproducible, and a call under
    `torch.use_deterministic_algorithms(True)` does not take it); false: by its ordered dQ kernel
    (deterministic; 1.01-1.18x slower on the H200, benchmarks/results/h200/run_2026-12-03_bwd_lse_tma)."""

    decode: bool = False
    """Compile a forward for decoding against a KV cache (`Variant.decode`): the `decode` path."""
    page_size: int = 0
    """With `decode`: 0 for a contiguous cache, else the page size of a paged one (16 to 256)."""
    splits: int = 0
    """With `decode`: a fixed number of splits of the cache per (batch, KV head); 0: the cost
    model's (see the module docstring)."""
    varlen: bool = False
    """Compile a forward over packed sequences (`Variant.varlen`): the `varlen` path."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.page_size and (self.page_size < 16 or self.page_size > 256 or self.page_size & (self.page_size - 1)):
            raise ValueError(f"kernel-path page-size must be 0 or a power of two in [16, 256], got {self.page_size}")
        if (self.page_size or self.splits) and not self.decode:
            raise ValueError("kernel-path page-size and splits need decode=true")
        if self.varlen and self.decode:
            raise ValueError("kernel-path takes decode=true or varlen=true, not both")
        if self.splits < 0:
            raise ValueError(f"kernel-path splits must be >= 0, got {self.splits}")
        if self.tanh not in get_args(TanhMode):  # `-p` options are checked by xDSL; this checks Python callers
            raise ValueError(f"kernel-path tanh must be one of {', '.join(get_args(TanhMode))}, got '{self.tanh}'")
        for name, value in (
            ("min-len", self.min_len),
            ("min-len-fwd", self.min_len_fwd),
            ("min-len-transformed", self.min_len_transformed),
        ):
            if value < 128:
                raise ValueError(f"kernel-path {name} must be >= 128, got {value}")
        if not set(self.head_dims) <= set(GLUON_FORWARD_HEAD_DIMS):
            raise ValueError(f"kernel-path head-dims must be among 64, 128 and 256, got {list(self.head_dims)}")
        sm = check_sm(target_option(op, "sm", self.sm, 90), self.name)
        seq_len = target_option(op, "seq_len", self.seq_len, 4096)
        for f in variant_funcs(op):
            chains = analyse(f)
            entry = self.entry(chains, sm, seq_len)
            f.attributes["attn.kernel_path"] = DictionaryAttr(entry)

    def inference_entry(self, v: AttentionChains, sm: int) -> dict[str, Attribute]:
        """The entries of a forward compiled for decoding (`decode`) or packed sequences (`varlen`)."""
        if v.is_backward and self.decode:
            raise DiagnosticException(f"func @{v.func.sym_name.data}: kernel-path decode=true takes a forward")
        entry: dict[str, Attribute] = {"path": StringAttr(VARLEN), "reason": StringAttr("packed sequences")}
        if self.decode:
            entry = {
                "path": StringAttr(DECODE),
                "page_size": IntegerAttr(self.page_size, i64),
                "waves": IntegerAttr(DECODE_WAVES, i64),
                "min_split_keys": IntegerAttr(DECODE_MIN_SPLIT_KEYS, i64),
                "splits": IntegerAttr(self.splits, i64),
            }
        half = isinstance(v.q_type.get_element_type(), BFloat16Type | Float16Type)
        if sm > 0 and half and computes_tanh(v.func) and self.tanh == "approx":
            entry["tanh"] = StringAttr("approx")
        return entry

    def fp8_entry(self, v: AttentionChains, sm: int) -> dict[str, Attribute]:
        """The entries of a forward in the FP8 form: `{path = "fp8", mma}` (see the module docstring)."""
        where = f"func @{v.func.sym_name.data}"
        if self.decode or self.varlen:
            raise DiagnosticException(
                f"{where} is in the FP8 form, which has no {'decode' if self.decode else 'varlen'} kernel: "
                "run it as a whole forward"
            )
        mma = "e4m3" if sm >= 89 else "f32"
        entry: dict[str, Attribute] = {"path": StringAttr(FP8), "mma": StringAttr(mma)}
        fp8_refusal(v, DictionaryAttr(entry), where)
        gluon = fp8_gluon_refusal(v, sm) if self.gluon else "disabled (gluon=false)"
        if gluon is None:
            entry["kernel"] = StringAttr(GLUON)
            entry["min_len"] = IntegerAttr(self.min_len, i64)
            reason = "e4m3 tensor cores, the sm90 Gluon kernel"
        elif mma == "e4m3":
            reason = f"e4m3 tensor cores, the generic kernel: {gluon}"
        else:
            reason = f"sm {sm} has no e4m3 tensor cores (or is the interpreter)"
        entry["reason"] = StringAttr(reason)
        return entry

    def entry(self, v: AttentionChains, sm: int, seq_len: int) -> dict[str, Attribute]:
        """The `attn.kernel_path` entries of function `v` (see the class docstring)."""
        if quantizes(v):
            return self.fp8_entry(v, sm)
        if self.decode or self.varlen:
            return self.inference_entry(v, sm)
        transformed = v.q_chain and not gluon_rotates_q(v) and not v.is_backward
        min_len = self.min_len_transformed if transformed else self.min_len
        if not transformed and not v.is_backward:
            min_len = min(min_len, self.min_len_fwd)
        reason = (
            gluon_refusal(v, sm, seq_len, min_len, tuple(self.head_dims)) if self.gluon else "disabled (gluon=false)"
        )
        entry: dict[str, Attribute]
        if reason is None:
            entry = {"path": StringAttr(GLUON), "min_len": IntegerAttr(min_len, i64)}
            if v.is_backward and self.dq_reduce:
                entry["dq"] = StringAttr("reduce")
        else:
            entry = {"path": StringAttr(TRITON), "reason": StringAttr(reason)}
        half = isinstance(v.q_type.get_element_type(), BFloat16Type | Float16Type)
        if sm > 0 and half and computes_tanh(v.func):
            if self.tanh == "approx":
                entry["tanh"] = StringAttr("approx")
            elif self.tanh == "auto" and reason is None:
                entry["tanh"] = StringAttr("approx-gluon")
        return entry
