// What the FP8 kernels do not take, each one diagnostic naming the function and the reason: k
// not quantized while q is, a head dim below the e4m3 products' 32, and an attn.kernel_path
// written by hand that says "fp8" for a function that is not in the FP8 form (or the reverse), or
// e4m3 products on a target without them.

// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90}' --verify-diagnostics | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'convert-attn-to-tl{sm=90}' --verify-diagnostics | filecheck %s --check-prefix=RECHECK
// RUN: attnfuse-opt %s --split-input-file -p 'convert-attn-to-tl{sm=0}' --verify-diagnostics | filecheck %s --check-prefix=SM0

// CHECK: func @q_only: the FP8 kernel multiplies e4m3 q by e4m3 k, but k is not quantized (end both chains in attn.quantize, or run the variant with af.backend('reference'))
func.func @q_only(%q: tensor<?x2x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>) -> tensor<?x2x?x64xbf16> {
  %q8 = attn.quantize %q e4m3 block = 0 : tensor<?x2x?x64xbf16>
  %s = attn.qk %q8, %k : tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xbf16> -> tensor<?x2x?x64xbf16>
  func.return %o : tensor<?x2x?x64xbf16>
}

// -----

// CHECK: func @d16: the FP8 kernel takes head dims that are powers of two from 32, got [16]
func.func @d16(%q: tensor<?x2x?x16xbf16>, %k: tensor<?x2x?x16xbf16>, %v: tensor<?x2x?x16xbf16>) -> tensor<?x2x?x16xbf16> {
  %q8 = attn.quantize %q e4m3 block = 0 : tensor<?x2x?x16xbf16>
  %k8 = attn.quantize %k e4m3 block = 0 : tensor<?x2x?x16xbf16>
  %s = attn.qk %q8, %k8 : tensor<?x2x?x16xbf16>, tensor<?x2x?x16xbf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xbf16> -> tensor<?x2x?x16xbf16>
  func.return %o : tensor<?x2x?x16xbf16>
}

// -----

// RECHECK: func @not_fp8: attn.kernel_path says "fp8", but the function is not in the FP8 form: the "fp8" path takes exactly the functions whose q and k end in attn.quantize
func.func @not_fp8(%q: tensor<?x2x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>) -> tensor<?x2x?x64xbf16> attributes {attn.kernel_path = {path = "fp8", mma = "e4m3"}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xbf16> -> tensor<?x2x?x64xbf16>
  func.return %o : tensor<?x2x?x64xbf16>
}

// -----

// RECHECK: func @fp8_unmarked is in the FP8 form: run kernel-path first
func.func @fp8_unmarked(%q: tensor<?x2x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>) -> tensor<?x2x?x64xbf16> attributes {attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %q8 = attn.quantize %q e4m3 block = 0 : tensor<?x2x?x64xbf16>
  %k8 = attn.quantize %k e4m3 block = 0 : tensor<?x2x?x64xbf16>
  %s = attn.qk %q8, %k8 : tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xbf16> -> tensor<?x2x?x64xbf16>
  func.return %o : tensor<?x2x?x64xbf16>
}

// -----

// SM0: func @e4m3_at_sm0: attn.kernel_path says mma = "e4m3", but sm 0 has no e4m3 tensor cores: "f32"
func.func @e4m3_at_sm0(%q: tensor<?x2x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>) -> tensor<?x2x?x64xbf16> attributes {attn.kernel_path = {path = "fp8", mma = "e4m3"}, attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %q8 = attn.quantize %q e4m3 block = 0 : tensor<?x2x?x64xbf16>
  %k8 = attn.quantize %k e4m3 block = 0 : tensor<?x2x?x64xbf16>
  %s = attn.qk %q8, %k8 : tensor<?x2x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xbf16> -> tensor<?x2x?x64xbf16>
  func.return %o : tensor<?x2x?x64xbf16>
}
