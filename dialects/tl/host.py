"""The `tl` host ops: the `tl.launcher` function and what it does (allocate outputs, build RoPE
tables, launch kernels, return). Their string properties are host Python expressions."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    FlatSymbolRefAttr,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    f32,
    f64,
    i64,
)
from xdsl.ir import (
    Attribute,
    Block,
    Operation,
    Region,
)
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.traits import HasParent, IsolatedFromAbove, NoTerminator
from xdsl.utils.exceptions import VerifyException

# --------------------------------------------------------------------------- host ops


@irdl_op_definition
class LauncherOp(IRDLOperation):
    """The host function `def <name>(<params>)` that allocates outputs and launches
    the kernels; `params` are the variant's tensor arguments in order."""

    name = "tl.launcher"
    sym_name = prop_def(StringAttr)
    params = prop_def(ArrayAttr[StringAttr])
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), IsolatedFromAbove())
    assembly_format = "$sym_name `(` $params `)` attr-dict-with-keyword $body"

    def __init__(self, name: str, params: Sequence[str], ops: Sequence[Operation]):
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "params": ArrayAttr(StringAttr(p) for p in params),
            },
            regions=[Region(Block(ops))],
        )


@irdl_op_definition
class HostIfOp(IRDLOperation):
    """`if <cond>: <then> else: <otherwise>` in the launcher: `cond` is a host expression,
    each region a block of host ops (the choice between a specialised kernel path and the
    generic one, made per call on the call's sizes)."""

    name = "tl.host_if"
    cond = prop_def(StringAttr)
    then = region_def("single_block")
    otherwise = region_def("single_block")
    traits = traits_def(NoTerminator(), HasParent(LauncherOp))
    assembly_format = "$cond attr-dict-with-keyword $then `else` $otherwise"

    def __init__(self, cond: str, then: Sequence[Operation], otherwise: Sequence[Operation]):
        super().__init__(properties={"cond": StringAttr(cond)}, regions=[Region(Block(then)), Region(Block(otherwise))])


class _HostOp(IRDLOperation):
    traits = traits_def(HasParent(LauncherOp, HostIfOp))


@irdl_op_definition
class AllocOp(_HostOp):
    """`name = torch.empty(shape, dtype=dtype, device=device)`; entries are host expressions.

    With `given`, the buffer is a keyword parameter of the launcher (`name=None`) that a
    caller may pass instead: a contiguous buffer of at least as many elements of `dtype` on
    `device`, which the kernels write and the caller may discard (a workspace, e.g. the
    log-sum-exp of a call that needs no backward). It is allocated only when not given.

    With `order_of`, a [B, H, N, D] buffer is laid out in the dimension order of that launcher
    tensor, as PyTorch's SDPA lays out its output in the query's: for a `like` whose heads are
    inner to its sequence (a [B, N, H, D] tensor seen through `transpose(1, 2)`, Hugging Face's
    layout) the buffer is `torch.empty([B, N, H, D]).transpose(1, 2)`, so that the caller's
    transpose back to [B, N, H·D] needs no copy (`_empty_ordered`)."""

    name = "tl.alloc"
    var = prop_def(StringAttr)
    shape = prop_def(ArrayAttr[StringAttr])
    dtype = prop_def(StringAttr)
    device = prop_def(StringAttr)
    given = opt_prop_def(UnitAttr)
    order_of = opt_prop_def(StringAttr)
    assembly_format = (
        "$var `shape` $shape `dtype` $dtype `device` $device (`given` $given^)? (`order_of` $order_of^)? attr-dict"
    )

    def __init__(
        self, var: str, shape: Sequence[str], dtype: str, device: str, given: bool = False, order_of: str | None = None
    ):
        super().__init__(
            properties={
                "var": StringAttr(var),
                "shape": ArrayAttr(StringAttr(s) for s in shape),
                "dtype": StringAttr(dtype),
                "device": StringAttr(device),
                **({"given": UnitAttr()} if given else {}),
                **({"order_of": StringAttr(order_of)} if order_of is not None else {}),
            }
        )

    def verify_(self) -> None:
        if self.order_of is not None and len(self.shape) != 4:
            raise VerifyException(
                f"tl.alloc {self.var.data!r} with order_of needs a [B, H, N, D] shape, got {len(self.shape)} entries"
            )


@irdl_op_definition
class RopeTableOp(_HostOp):
    """`cos, sin = _rope_table(key, inv_freq, length, magnitude, device)`: float32
    [positions, rotary_dim / 2] tables of magnitude * cos(pos * inv_freq) and
    magnitude * sin(...), built once per device and power-of-two length bucket."""

    name = "tl.rope_table"
    cos = prop_def(StringAttr)
    sin = prop_def(StringAttr)
    values = prop_def(ArrayAttr[FloatAttr])
    length = prop_def(StringAttr)
    magnitude = prop_def(FloatAttr[Float32Type])
    device = prop_def(StringAttr)
    assembly_format = (
        "$cos `,` $sin `inv_freq` $values `length` $length `magnitude` $magnitude `device` $device attr-dict"
    )

    def __init__(self, cos: str, sin: str, values: Sequence[float], length: str, magnitude: float, device: str):
        super().__init__(
            properties={
                "cos": StringAttr(cos),
                "sin": StringAttr(sin),
                "values": ArrayAttr(FloatAttr(float(v), f32) for v in values),
                "length": StringAttr(length),
                "magnitude": FloatAttr(float(magnitude), f32),
                "device": StringAttr(device),
            }
        )


@irdl_op_definition
class FreqTableOp(_HostOp):
    """`var = _freq_table(var, inv_freq, device)`: RoPE's inverse frequencies as a float32
    tensor, built once per device (kernels rotating at explicit positions compute cos and
    sin from them)."""

    name = "tl.freq_table"
    var = prop_def(StringAttr)
    values = prop_def(ArrayAttr[FloatAttr])
    device = prop_def(StringAttr)
    assembly_format = "$var `inv_freq` $values `device` $device attr-dict"

    def __init__(self, var: str, values: Sequence[float], device: str):
        super().__init__(
            properties={
                "var": StringAttr(var),
                "values": ArrayAttr(FloatAttr(float(v), f32) for v in values),
                "device": StringAttr(device),
            }
        )


@irdl_op_definition
class HadamardTableOp(_HostOp):
    """`var = _hadamard_table(d, seed, device)`: the parts of attn.hadamard's orthogonal matrix
    M = diag(signs) H / sqrt(d) for head dim `d` and sign seed `seed`: `var[0]`, H (float16
    [d, d] of ±1), and `var[1]`, the signs (float32 [d]); built once per device."""

    name = "tl.hadamard_table"
    var = prop_def(StringAttr)
    d = prop_def(IntegerAttr[I64])
    seed = prop_def(IntegerAttr[I64])
    device = prop_def(StringAttr)
    assembly_format = "$var `d` $d `seed` $seed `device` $device attr-dict"

    def __init__(self, var: str, d: int, seed: int, device: str):
        super().__init__(
            properties={
                "var": StringAttr(var),
                "d": IntegerAttr(d, i64),
                "seed": IntegerAttr(seed, i64),
                "device": StringAttr(device),
            }
        )

    def verify_(self) -> None:
        d = self.d.value.data
        if d < 1 or d & (d - 1) or self.seed.value.data < 0:
            raise VerifyException(f"tl.hadamard_table needs a power-of-two d and a seed >= 0, got d={d}")


@irdl_op_definition
class CallOp(_HostOp):
    """`kernel[grid](*args, num_warps=..., num_stages=...)`: one kernel launch.

    `grid` and `args` are host expressions; `args` match the kernel's parameters
    in order, constexpr parameters included."""

    name = "tl.call"
    callee = prop_def(StringAttr)
    grid = prop_def(ArrayAttr[StringAttr])
    args = prop_def(ArrayAttr[StringAttr])
    num_warps = prop_def(IntegerAttr[I64])
    num_stages = prop_def(IntegerAttr[I64])
    assembly_format = "$callee `grid` $grid `args` $args `num_warps` $num_warps `num_stages` $num_stages attr-dict"

    def __init__(self, callee: str, grid: Sequence[str], args: Sequence[str], num_warps: int, num_stages: int):
        super().__init__(
            properties={
                "callee": StringAttr(callee),
                "grid": ArrayAttr(StringAttr(g) for g in grid),
                "args": ArrayAttr(StringAttr(a) for a in args),
                "num_warps": IntegerAttr(num_warps, i64),
                "num_stages": IntegerAttr(num_stages, i64),
            }
        )


@irdl_op_definition
class HostReturnOp(_HostOp):
    """`return <values>` of the launcher (host expressions)."""

    name = "tl.host_return"
    values = prop_def(ArrayAttr[StringAttr])
    assembly_format = "$values attr-dict"

    def __init__(self, values: Sequence[str]):
        super().__init__(properties={"values": ArrayAttr(StringAttr(v) for v in values)})


@irdl_op_definition
class HostSumOp(_HostOp):
    """`var = source.sum(dims).to(dtype)`: reduce per-program partial results (the
    deterministic sum of a gradient's partials)."""

    name = "tl.host_sum"
    var = prop_def(StringAttr)
    source = prop_def(StringAttr)
    dims = prop_def(ArrayAttr[IntegerAttr[I64]])
    dtype = prop_def(StringAttr)
    assembly_format = "$var `=` $source `dims` $dims `dtype` $dtype attr-dict"

    def __init__(self, var: str, source: str, dims: Sequence[int], dtype: str):
        super().__init__(
            properties={
                "var": StringAttr(var),
                "source": StringAttr(source),
                "dims": ArrayAttr(IntegerAttr(d, i64) for d in dims),
                "dtype": StringAttr(dtype),
            }
        )


@irdl_op_definition
class HostAssignOp(_HostOp):
    """`var = value`: a host value the launcher computes once and passes on (a host expression)."""

    name = "tl.host_assign"
    var = prop_def(StringAttr)
    value = prop_def(StringAttr)
    assembly_format = "$var `=` $value attr-dict"

    def __init__(self, var: str, value: str):
        super().__init__(properties={"var": StringAttr(var), "value": StringAttr(value)})


@irdl_op_definition
class DecodeSplitsOp(_HostOp):
    """`splits, keys = _decode_splits(rows, length, block_n, waves, min_keys, fixed, device)`:
    how many programs a decode launch gives each of its `rows` (batch x KV heads) and how many
    cache keys each reads, a multiple of `block_n`. The cost model: `cdiv(waves x SMs, rows)`
    splits, at most `cdiv(length, min_keys)` and one per block of the cache's `length` keys;
    `fixed` > 0 replaces it. `rows`, `length` and `device` are host expressions."""

    name = "tl.decode_splits"
    splits = prop_def(StringAttr)
    keys = prop_def(StringAttr)
    rows = prop_def(StringAttr)
    length = prop_def(StringAttr)
    block_n = prop_def(IntegerAttr[I64])
    waves = prop_def(IntegerAttr[I64])
    min_keys = prop_def(IntegerAttr[I64])
    fixed = prop_def(IntegerAttr[I64])
    device = prop_def(StringAttr)
    assembly_format = (
        "$splits `,` $keys `rows` $rows `length` $length `block_n` $block_n `waves` $waves `min_keys` $min_keys "
        "`fixed` $fixed `device` $device attr-dict"
    )

    def __init__(
        self,
        splits: str,
        keys: str,
        rows: str,
        length: str,
        block_n: int,
        waves: int,
        min_keys: int,
        fixed: int,
        device: str,
    ):
        super().__init__(
            properties={
                "splits": StringAttr(splits),
                "keys": StringAttr(keys),
                "rows": StringAttr(rows),
                "length": StringAttr(length),
                "block_n": IntegerAttr(block_n, i64),
                "waves": IntegerAttr(waves, i64),
                "min_keys": IntegerAttr(min_keys, i64),
                "fixed": IntegerAttr(fixed, i64),
                "device": StringAttr(device),
            }
        )

    def verify_(self) -> None:
        for name in ("block_n", "waves", "min_keys"):
            if getattr(self, name).value.data < 1:
                raise VerifyException(f"tl.decode_splits {name} must be >= 1")
        if self.fixed.value.data < 0:
            raise VerifyException("tl.decode_splits fixed must be >= 0 (0: the cost model)")


@irdl_op_definition
class GluonAttentionOp(_HostOp):
    """`_gluon_attention(q, k, v, out, lse, qk_scale, ...)`: the sm90 Gluon attention kernel
    (`attnfuse/targets/triton/gluon_sm90.py`, `attn_fwd_sm90`) on a k holding its transforms
    (and a q holding its own, unless `q_norm` / `rope`): out and lse of
    softmax(score ops(q·kᵀ·qk_scale)) v, GQA from the
    head counts, the per-head `sink` logits (a host expression) in the denominator.

    The score ops are `causal` or none, or the variant's own as `tl.device_fn`s: `range`
    (the KV blocks a Q tile visits), `score` (unmasked blocks; absent when the ops are masks
    only) and `masked` (masked blocks), which read the host expressions `args`; `natural`:
    they read the scaled scores (else only masks, on the raw scores). `q_norm` (an eps, and
    `q_norm_weight`) and `rope` (the cos and sin tables, and their rows per sequence: 0 for tables
    by position): the RMSNorm and RoPE the kernel applies to q itself, in that order (else q
    holds its transforms). `fp8`: q, k and v are e4m3 (v a transposed view of channel-major
    storage) with these scales: (q's, k's, v's, q's rows per scale, k's and v's keys per scale;
    0: one scale per tensor). Operands are host expressions."""

    name = "tl.gluon_attention"
    q = prop_def(StringAttr)
    k = prop_def(StringAttr)
    v = prop_def(StringAttr)
    out = prop_def(StringAttr)
    lse = prop_def(StringAttr)
    qk_scale = prop_def(FloatAttr[Float64Type])
    causal = opt_prop_def(UnitAttr)
    sink = opt_prop_def(StringAttr)
    range_fn = opt_prop_def(FlatSymbolRefAttr)
    score_full = opt_prop_def(FlatSymbolRefAttr)
    score_masked = opt_prop_def(FlatSymbolRefAttr)
    natural = opt_prop_def(UnitAttr)
    args = opt_prop_def(ArrayAttr[StringAttr])
    rope = opt_prop_def(ArrayAttr[StringAttr])
    q_norm_eps = opt_prop_def(FloatAttr[Float64Type])
    q_norm_weight = opt_prop_def(StringAttr)
    fp8 = opt_prop_def(ArrayAttr[StringAttr])
    assembly_format = (
        "$q `,` $k `,` $v `->` $out `,` $lse `scale` $qk_scale (`causal` $causal^)? (`sink` $sink^)?"
        " (`range` $range_fn^)? (`score` $score_full^)? (`masked` $score_masked^)? (`natural` $natural^)?"
        " (`args` $args^)? (`rope` $rope^)? (`q_norm` $q_norm_eps^)? (`q_norm_weight` $q_norm_weight^)?"
        " (`fp8` $fp8^)? attr-dict"
    )

    def __init__(
        self,
        q: str,
        k: str,
        v: str,
        out: str,
        lse: str,
        qk_scale: float,
        causal: bool,
        sink: str | None = None,
        hooks: tuple[str, str | None, str] | None = None,
        natural: bool = False,
        args: Sequence[str] = (),
        rope: tuple[str, str, str] | None = None,
        q_norm: tuple[str | None, float] | None = None,
        fp8: Sequence[str] | None = None,
    ):
        props: dict[str, Attribute] = {
            "q": StringAttr(q),
            "k": StringAttr(k),
            "v": StringAttr(v),
            "out": StringAttr(out),
            "lse": StringAttr(lse),
            "qk_scale": FloatAttr(float(qk_scale), f64),
        }
        if causal:
            props["causal"] = UnitAttr()
        if sink is not None:
            props["sink"] = StringAttr(sink)
        if hooks is not None:
            range_fn, full, masked = hooks
            props["range_fn"] = SymbolRefAttr(range_fn)
            props["score_masked"] = SymbolRefAttr(masked)
            if full is not None:
                props["score_full"] = SymbolRefAttr(full)
        if natural:
            props["natural"] = UnitAttr()
        if args:
            props["args"] = ArrayAttr(StringAttr(a) for a in args)
        if rope is not None:
            props["rope"] = ArrayAttr(StringAttr(t) for t in rope)
        super().__init__(properties=props | self._q_props(q_norm, fp8))

    @staticmethod
    def _q_props(q_norm: tuple[str | None, float] | None, fp8: Sequence[str] | None) -> dict[str, Attribute]:
        """The properties of Q's RMSNorm and of the FP8 form."""
        props: dict[str, Attribute] = {}
        if q_norm is not None:
            weight, eps = q_norm
            props["q_norm_eps"] = FloatAttr(float(eps), f64)
            if weight is not None:
                props["q_norm_weight"] = StringAttr(weight)
        if fp8 is not None:
            props["fp8"] = ArrayAttr(StringAttr(x) for x in fp8)
        return props

    def verify_(self) -> None:
        hooked = self.range_fn is not None
        if hooked != (self.score_masked is not None) or (self.score_full is not None and not hooked):
            raise VerifyException("tl.gluon_attention takes `range` and `masked` together (and `score` only with them)")
        if hooked and self.causal is not None:
            raise VerifyException("tl.gluon_attention with score functions takes no `causal`: its mask is theirs")
        if not hooked and (self.natural is not None or self.args is not None):
            raise VerifyException("tl.gluon_attention `natural` and `args` need score functions")
        if self.rope is not None and len(self.rope.data) != 3:
            raise VerifyException(
                "tl.gluon_attention `rope` names three host values: the cos and sin tables and their rows per sequence"
            )
        if self.q_norm_weight is not None and self.q_norm_eps is None:
            raise VerifyException("tl.gluon_attention `q_norm_weight` needs `q_norm` (its eps)")
        if self.fp8 is not None and len(self.fp8.data) != 5:
            raise VerifyException(
                "tl.gluon_attention `fp8` names five host values: q's, k's and v's scales, q's and k's rows per scale"
            )


@irdl_op_definition
class GluonBackwardOp(_HostOp):
    """`_gluon_backward(q, k, v, dout, lse, delta, dq_acc, dk, dv, dk_scale, ...)`: the sm90 Gluon
    backward kernels (`attnfuse/targets/triton/gluon_bwd_sm90.py`, launched by
    `gluon_bwd_launch.py`) on a q and k holding their transforms (k before its RoPE with
    `apply_k_rope`): dk = dk_scale · dSᵀ q and dv = Pᵀ dout summed over each kv head's query heads
    (`attn_bwd_sm90`), and dS·k, unscaled, into the fp32 workspace `dq_acc`: by the ordered dQ
    kernel (`attn_bwd_dq_sm90`), or, where the host expression `reduce_dq` is true, by TMA
    reduce-adds from the dK/dV kernel. P and dS come from the variant's `tl.device_fn`s: `range`
    (the query blocks a block of keys meets), `kv_range` (the key blocks a Q tile meets), `full` and
    `masked` (P and dS of unmasked and masked blocks), which read the host expressions `args`. With
    `k_rope` (the cos and sin tables of K's RoPE, half style over every channel, and their rows per
    sequence: 0 for tables by position), dk is the gradient of k before that RoPE: the dK/dV kernel
    stores it back through the RoPE; with `apply_k_rope` too, k is given before the RoPE and the
    kernel applies it to its keys itself. Operands are host expressions."""

    name = "tl.gluon_backward"
    q = prop_def(StringAttr)
    k = prop_def(StringAttr)
    v = prop_def(StringAttr)
    dout = prop_def(StringAttr)
    lse = prop_def(StringAttr)
    delta = prop_def(StringAttr)
    dq_acc = prop_def(StringAttr)
    dk = prop_def(StringAttr)
    dv = prop_def(StringAttr)
    dk_scale = prop_def(FloatAttr[Float64Type])
    range_fn = prop_def(FlatSymbolRefAttr)
    kv_range_fn = prop_def(FlatSymbolRefAttr)
    full = prop_def(FlatSymbolRefAttr)
    masked = prop_def(FlatSymbolRefAttr)
    reduce_dq = opt_prop_def(StringAttr)
    args = opt_prop_def(ArrayAttr[StringAttr])
    k_rope = opt_prop_def(ArrayAttr[StringAttr])
    apply_k_rope = opt_prop_def(UnitAttr)
    assembly_format = (
        "$q `,` $k `,` $v `,` $dout `,` $lse `,` $delta `->` $dq_acc `,` $dk `,` $dv `scale` $dk_scale"
        " `range` $range_fn `kv_range` $kv_range_fn `full` $full `masked` $masked"
        " (`reduce_dq` $reduce_dq^)? (`args` $args^)? (`k_rope` $k_rope^)? (`apply_k_rope` $apply_k_rope^)? attr-dict"
    )

    def __init__(
        self,
        tensors: Sequence[str],
        outputs: Sequence[str],
        dk_scale: float,
        hooks: Sequence[str],
        reduce_dq: str | None = None,
        args: Sequence[str] = (),
        k_rope: tuple[str, str, str] | None = None,
        apply_k_rope: bool = False,
    ):
        q, k, v, dout, lse, delta = tensors
        dq_acc, dk, dv = outputs
        named = (("q", q), ("k", k), ("v", v), ("dout", dout), ("lse", lse), ("delta", delta))
        named += (("dq_acc", dq_acc), ("dk", dk), ("dv", dv))
        props: dict[str, Attribute] = {name: StringAttr(value) for name, value in named}
        props["dk_scale"] = FloatAttr(float(dk_scale), f64)
        for name, ref in zip(("range_fn", "kv_range_fn", "full", "masked"), hooks, strict=True):
            props[name] = SymbolRefAttr(ref)
        if reduce_dq is not None:
            props["reduce_dq"] = StringAttr(reduce_dq)
        if args:
            props["args"] = ArrayAttr(StringAttr(a) for a in args)
        if k_rope is not None:
            props["k_rope"] = ArrayAttr(StringAttr(t) for t in k_rope)
        if apply_k_rope:
            props["apply_k_rope"] = UnitAttr()
        super().__init__(properties=props)

    def verify_(self) -> None:
        if self.k_rope is not None and len(self.k_rope.data) != 3:
            raise VerifyException(
                "tl.gluon_backward `k_rope` names three host values: the cos and sin tables and their rows per sequence"
            )
        if self.apply_k_rope is not None and self.k_rope is None:
            raise VerifyException(
                "tl.gluon_backward `apply_k_rope` applies K's RoPE: it needs `k_rope`, the RoPE's tables"
            )
