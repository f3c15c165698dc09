// convert-attn-to-tl re-checks the kernel an attn.kernel_path names (written by hand, or left
// from another target) before it lowers the function: one diagnostic naming the function and
// what the Gluon kernel does not take, never a Gluon kernel for it.

// RUN: attnfuse-opt %s --split-input-file -p 'convert-attn-to-tl' --verify-diagnostics | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'convert-attn-to-tl{sm=80}' --verify-diagnostics | filecheck %s --check-prefix=SM80
// RUN: sed -e '/^func.func @f32/,/^}$/{s/^func.func/builtin.module attributes {attn.target = {sm = 80 : i64}} { func.func/;s/^}$/} }/}' %s | attnfuse-opt --split-input-file -p convert-attn-to-tl --verify-diagnostics | filecheck %s --check-prefix=SM80

// f32 inputs: the Gluon kernel takes bf16/f16 only (at sm 80, it is not the target's kernel at all).
// CHECK-NOT: tl.gluon_attention
// CHECK:  func @f32: attn.kernel_path says gluon-sm90, but the Gluon kernel cannot compute it: q, k and v are not all bf16 or all f16 (run kernel-path to choose)
// SM80:   func @f32: attn.kernel_path says gluon-sm90, but the Gluon kernel cannot compute it: sm 80: the Gluon kernel is for sm 90 (Hopper) (run kernel-path to choose)
func.func @f32(%q: tensor<?x2x?x128xf32>, %k: tensor<?x2x?x128xf32>, %v: tensor<?x2x?x128xf32>) -> tensor<?x2x?x128xf32> attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 2048 : i64}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x128xf32>, tensor<?x2x?x128xf32> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x128xf32> -> tensor<?x2x?x128xf32>
  func.return %o : tensor<?x2x?x128xf32>
}

// -----

// A head dim the Gluon kernel has no tiles for.
// CHECK:  func @d32: attn.kernel_path says gluon-sm90, but the Gluon kernel cannot compute it: head dims [32]: the Gluon kernel takes 64, 128 or 256, the same for q, k and v (run kernel-path to choose)
func.func @d32(%q: tensor<?x2x?x32xbf16>, %k: tensor<?x2x?x32xbf16>, %v: tensor<?x2x?x32xbf16>) -> tensor<?x2x?x32xbf16> attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 2048 : i64}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x32xbf16>, tensor<?x2x?x32xbf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x32xbf16> -> tensor<?x2x?x32xbf16>
  func.return %o : tensor<?x2x?x32xbf16>
}

// -----

// A path the compiler does not know.
// CHECK:  func @unknown: attn.kernel_path must be a dictionary with path = "gluon-sm90", "triton", "decode", "varlen" or "fp8", got {path = "cuda"}
func.func @unknown(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> attributes {attn.kernel_path = {path = "cuda"}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}

// -----

// The Gluon path without its shortest length.
// CHECK:  func @no_min_len: attn.kernel_path says gluon-sm90 with min_len None: expected an integer >= 128
func.func @no_min_len(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> attributes {attn.kernel_path = {path = "gluon-sm90"}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}

// -----

// The approximate tanh instruction on f32 inputs (kernel-path gives it to bf16/f16 only).
// CHECK:  func @tanh_f32: attn.kernel_path says tanh = "approx", but the approximate tanh instruction needs bf16/f16 inputs on a GPU, got f32 at sm 90
func.func @tanh_f32(%q: tensor<?x2x?x64xf32>, %k: tensor<?x2x?x64xf32>, %v: tensor<?x2x?x64xf32>) -> tensor<?x2x?x64xf32> attributes {attn.kernel_path = {path = "triton", reason = "hand-written", tanh = "approx"}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf32>, tensor<?x2x?x64xf32> -> !attn.scores<2>
  %c = attn.softcap %s cap = 30.0 : !attn.scores<2>
  %p = attn.softmax %c : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf32> -> tensor<?x2x?x64xf32>
  func.return %o : tensor<?x2x?x64xf32>
}

// -----

// What kernel-path gives stays valid: a bf16, head dim 128 forward lowers to the Gluon launch.
// CHECK:  tl.gluon_attention "q", "k", "v"
func.func @ok(%q: tensor<?x2x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>) -> tensor<?x2x?x128xbf16> attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 2048 : i64}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x128xbf16> -> tensor<?x2x?x128xbf16>
  func.return %o : tensor<?x2x?x128xbf16>
}

// -----

// dQ by reduce-adds is the Gluon backward's option: a forward does not take it.
// CHECK:  func @fwd_reduce: attn.kernel_path dq = "reduce": only a backward on "gluon-sm90" takes dq = "reduce"
func.func @fwd_reduce(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 2048 : i64, dq = "reduce"}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}

// -----

// A decode entry with a page size the decode kernel does not take.
// CHECK:  func @bad_page: attn.kernel_path page_size must be 0 (contiguous) or a power of two in [16, 256], got 48
func.func @bad_page(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> attributes {attn.kernel_path = {path = "decode", page_size = 48 : i64, waves = 2 : i64, min_split_keys = 256 : i64, splits = 0 : i64}, attn.tiling = {block_m = 16 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}

// -----

// A decode entry without its split cost model.
// CHECK:  func @no_waves: attn.kernel_path "decode" needs an integer waves, got None
func.func @no_waves(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> attributes {attn.kernel_path = {path = "decode", page_size = 0 : i64}, attn.tiling = {block_m = 16 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}
