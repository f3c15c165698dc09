// RUN: attnfuse-opt %s --split-input-file -p convert-attn-to-tl --verify-diagnostics | filecheck %s

// What convert-attn-to-tl cannot lower is one diagnostic naming it, not a traceback.

// The tile sizes come from the tiling pass.
func.func @no_tiling(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
// CHECK: func @no_tiling has no attn.tiling: run the tiling pass before convert-attn-to-tl

// -----

func.func @two_ropes(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> attributes {attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 16 : tensor<?x2x?x16xf16>
  %qr2 = attn.rope %qr half theta = 10000.0 rotary_dim = 16 : tensor<?x2x?x16xf16>
  %s = attn.qk %qr2, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
// CHECK: the Triton lowering applies at most one attn.rope to q and to k

// -----

// One launcher per module: two attention functions must be compiled separately.
func.func @a(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> attributes {attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
func.func @b(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> attributes {attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64}} {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
// CHECK: convert-attn-to-tl lowers one attention function per module, found 2: split the input (e.g. --split-input-file)
