// RUN: ATTN_VERIFY
// RUN: echo 'tl.kernel @k(%a: i32) { %c = tl.cmp "<>" %a, %a : i32, i32 -> i1 tl.return }' | not attnfuse-opt 2>&1 | filecheck %s --check-prefix=PRED
// PRED: tl.cmp "<>"
// PRED: Expected `<`, `<=`, `==`, `!=`, `>`, or `>=`.
// RUN: echo 'tl.kernel @k(%n: i32) { %r = tl.arange %n : i32 -> !tl.tile<i32> %e = tl.reduce min %r axis 0 : !tl.tile<i32> tl.return }' | not attnfuse-opt 2>&1 | filecheck %s --check-prefix=KIND
// KIND: tl.reduce min
// KIND: Expected `max`, or `sum`.

// Each tl verifier rule, one chunk each: the diagnostic names the rule broken.

// constexpr positions index the kernel's parameters (only the generic form can get this wrong).
"tl.kernel"() <{sym_name = "k", constexprs = [#builtin.int<1>]}> ({
^bb0(%a: i32):
  "tl.return"() : () -> ()
}) : () -> ()
// CHECK: tl.kernel constexpr index 1 out of range

// -----

// A kernel body ends with tl.return.
tl.kernel @no_return(%a: i32) {
  %c = tl.constant 1 : i32
}
// CHECK: Operation tl.constant terminates block in single-block region but is not a terminator

// -----

// tl.return ends kernels and device functions only.
tl.launcher "launch"(["x"]) {
  tl.return
}
// CHECK: tl.return must be in a tl.kernel or tl.device_fn

// -----

// A kernel returns nothing.
tl.kernel @k(%a: i32) {
  tl.return %a : i32
}
// CHECK: tl.return in a tl.kernel returns no values

// -----

// A device function returns its results.
tl.device_fn @f(%a: i32) {
  tl.return
}
// CHECK: tl.device_fn body must end with a tl.return of its results

// -----

// The Gluon kernel's score functions come together: range and masked.
tl.launcher "launch"(["x"]) {
  tl.gluon_attention "x", "x", "x" -> "out", "lse" scale 1.000000e+00 range @f
  tl.host_return ["out"]
}
// CHECK: tl.gluon_attention takes `range` and `masked` together (and `score` only with them)

// -----

// With score functions the mask is theirs.
tl.launcher "launch"(["x"]) {
  tl.gluon_attention "x", "x", "x" -> "out", "lse" scale 1.000000e+00 causal range @f masked @f
  tl.host_return ["out"]
}
// CHECK: tl.gluon_attention with score functions takes no `causal`: its mask is theirs

// -----

// natural and args are the score functions'.
tl.launcher "launch"(["x"]) {
  tl.gluon_attention "x", "x", "x" -> "out", "lse" scale 1.000000e+00 natural
  tl.host_return ["out"]
}
// CHECK: tl.gluon_attention `natural` and `args` need score functions

// -----

// Predicates and reduce kinds are enums: in the custom form a bad one is a parse error
// (the PRED and KIND run lines above); in the generic form, a verifier error.
tl.kernel @bad_cmp(%a: i32) {
  %c = "tl.cmp"(%a, %a) <{predicate = "<>"}> : (i32, i32) -> i1
  tl.return
}
// CHECK: "tl.cmp"(%a, %a)
// CHECK: Operation does not verify: "<>" should be of base attribute tl.cmp_predicate

// -----

tl.kernel @bad_axis(%n: i32) {
  %r = tl.arange %n : i32 -> !tl.tile<i32>
  %e = tl.expand_dims %r axis 2 : !tl.tile<i32>
  tl.return
}
// CHECK: tl.expand_dims axis must be 0 or 1

// -----

tl.kernel @bad_reduce(%n: i32) {
  %r = tl.arange %n : i32 -> !tl.tile<i32>
  %e = "tl.reduce"(%r) <{kind = "min", axis = 0 : i64}> : (!tl.tile<i32>) -> !tl.tile<i32>
  tl.return
}
// CHECK: "tl.reduce"(%r)
// CHECK: Operation does not verify: "min" should be of base attribute tl.reduce_kind

// -----

// The body takes the induction variable and one argument per carried value.
tl.kernel @for_args(%n: i32) {
  %c0 = tl.constant 0 : i32
  %r = "tl.for"(%c0, %n, %n, %c0) ({
  ^bb0(%i: i32):
    "tl.yield"(%i) : (i32) -> ()
  }) : (i32, i32, i32, i32) -> i32
  tl.return
}
// CHECK: tl.for body must take the induction variable and carried values

// -----

// ... and yields every carried value.
tl.kernel @for_yield(%n: i32) {
  %c0 = tl.constant 0 : i32
  %r = tl.for %i = %c0 to %n step %n iter_args(%x = %c0) -> (i32) {
    tl.yield
  }
  tl.return
}
// CHECK: tl.for body must end with tl.yield of every carried value

// -----

// tl.yield only ends a tl.for body.
tl.launcher "launch"(["x"]) {
  tl.yield
}
// CHECK: 'tl.yield' expects parent op 'tl.for'

// -----

// Host ops live in the launcher.
tl.kernel @host_in_kernel(%n: i32) {
  tl.alloc "out" shape ["4"] dtype "torch.float16" device "x.device"
  tl.return
}
// CHECK: 'tl.alloc' expects parent op to be one of 'tl.launcher', 'tl.host_if'

// -----

// An output laid out in another tensor's dimension order is a [B, H, N, D] one.
tl.launcher "launch"(["x"]) {
  tl.alloc "out" shape ["x.shape[0]", "16"] dtype "torch.float16" device "x.device" order_of "x"
  tl.host_return ["out"]
}
// CHECK: tl.alloc 'out' with order_of needs a [B, H, N, D] shape, got 2 entries

// -----

// A tl.host_if is a launcher's.
tl.kernel @if_in_kernel(%n: i32) {
  tl.host_if "True" {
    tl.host_return ["out"]
  } else {
    tl.host_return ["out"]
  }
  tl.return
}
// CHECK: 'tl.host_if' expects parent op 'tl.launcher'

// -----

// tl.arange's end is an integer.
tl.kernel @arange_float(%f: f32) {
  %r = tl.arange %f : f32 -> !tl.tile<i32>
  tl.return
}
// CHECK: f32 should be of base attribute integer_type

// -----

// tl.dot multiplies tiles.
tl.kernel @dot_scalar(%f: f32) {
  %d = tl.dot %f, %f : f32, f32 -> !tl.tile<f32>
  tl.return
}
// CHECK: f32 should be of base attribute tl.tile

// -----

// Unary ops (and trans, expand_dims, reduce) keep their input's type.
tl.kernel @unary_type(%f: f32) {
  %e = "tl.exp2"(%f) : (f32) -> f16
  tl.return
}
// CHECK:      "tl.exp2"(%f)
// CHECK:      Operation does not verify: result 'result' at position 0 does not verify:
// CHECK-NEXT: attribute f32 expected from variable 'T', but got f16

// -----

// A grid query's axis is an i64.
tl.kernel @axis_type() {
  %p = "tl.program_id"() <{axis = 0 : i32}> : () -> i32
  tl.return
}
// CHECK: "tl.program_id"()
// CHECK: Operation does not verify: Expected attribute i64 but got i32

// -----

// tl.gather reads along axis 0 or 1, at integer indices.
tl.kernel @gather_axis(%n: i32) {
  %r = tl.arange %n : i32 -> !tl.tile<i32>
  %g = tl.gather %r[%r] axis 2 : !tl.tile<i32>, !tl.tile<i32>
  tl.return
}
// CHECK: tl.gather axis must be 0 or 1, got 2

// -----

tl.kernel @gather_float_index(%n: i32) {
  %r = tl.arange %n : i32 -> !tl.tile<i32>
  %f = tl.cast %r : !tl.tile<i32> -> !tl.tile<f32>
  %g = tl.gather %r[%f] axis 0 : !tl.tile<i32>, !tl.tile<f32>
  tl.return
}
// CHECK: tl.gather index must be an integer tile, got !tl.tile<f32>

// -----

// A decode launch splits its cache into blocks of at least one key.
tl.launcher "launch"(["q", "k"]) {
  tl.decode_splits "splits", "keys" rows "q.shape[0]" length "k.shape[2]" block_n 0 waves 2 min_keys 256 fixed 0 device "q.device"
}
// CHECK: tl.decode_splits block_n must be >= 1

// -----

// A fixed split count is 0 (the cost model) or more.
tl.launcher "launch"(["q", "k"]) {
  tl.decode_splits "splits", "keys" rows "q.shape[0]" length "k.shape[2]" block_n 64 waves 2 min_keys 256 fixed -1 device "q.device"
}
// CHECK: tl.decode_splits fixed must be >= 0 (0: the cost model)

// -----

// A Hadamard matrix needs a power-of-two size.
tl.launcher "launch"(["q"]) {
  tl.hadamard_table "h" d 96 seed 0 device "q.device"
}
// CHECK: tl.hadamard_table needs a power-of-two d and a seed >= 0, got d=96

// -----

// The FP8 form's Gluon launch names its five scale values.
tl.launcher "launch"(["q"]) {
  tl.gluon_attention "q", "q", "q" -> "out", "lse" scale 1.000000e+00 causal fp8 ["s", "s"]
}
// CHECK: tl.gluon_attention `fp8` names five host values: q's, k's and v's scales, q's and k's rows per scale

// -----

// Q's RoPE in the Gluon kernel: its cos and sin tables and their rows per sequence.
tl.launcher "launch"(["q"]) {
  tl.gluon_attention "q", "q", "q" -> "out", "lse" scale 1.000000e+00 causal rope ["cos", "sin"]
}
// CHECK: tl.gluon_attention `rope` names three host values: the cos and sin tables and their rows per sequence

// -----

// K's RoPE in the Gluon backward: its cos and sin tables and their rows per sequence.
tl.launcher "launch"(["q"]) {
  tl.gluon_backward "q", "q", "q", "q", "lse", "delta" -> "dq", "dk", "dv" scale 1.000000e+00 range @f kv_range @f full @f masked @f k_rope ["cos", "sin"]
}
// CHECK: tl.gluon_backward `k_rope` names three host values: the cos and sin tables and their rows per sequence

// -----

// The Gluon backward applies K's RoPE itself (`apply_k_rope`) only with the RoPE's tables.
tl.launcher "launch"(["q"]) {
  tl.gluon_backward "q", "q", "q", "q", "lse", "delta" -> "dq", "dk", "dv" scale 1.000000e+00 range @f kv_range @f full @f masked @f apply_k_rope
}
// CHECK: tl.gluon_backward `apply_k_rope` applies K's RoPE: it needs `k_rope`, the RoPE's tables
