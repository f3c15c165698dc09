// RUN: ATTN_VERIFY

// Broken attn.qk ops, one per chunk.

func.func @head_dims_differ(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x128xf16>) {
  %s = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x128xf16> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk q and k head dims differ: 64 vs 128

// -----

func.func @element_types_differ(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf32>) {
  %s = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf32> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk q and k element types differ: f16 vs f32

// -----

func.func @heads_not_a_multiple(%q: tensor<?x8x?x64xf16>, %k: tensor<?x3x?x64xf16>) {
  %s = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x3x?x64xf16> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk q heads (8) must be a multiple of k heads (3)

// -----

func.func @more_k_heads_than_q(%q: tensor<?x2x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<2>
  func.return
}
// CHECK: attn.qk q heads (2) must be a multiple of k heads (8)

// -----

func.func @batch_differs(%q: tensor<2x8x?x64xf16>, %k: tensor<3x8x?x64xf16>) {
  %s = attn.qk %q, %k : tensor<2x8x?x64xf16>, tensor<3x8x?x64xf16> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk q and k batch sizes differ: 2 vs 3

// -----

func.func @result_heads(%q: tensor<?x8x?x64xf16>, %k: tensor<?x2x?x64xf16>) {
  %s = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  func.return
}
// CHECK: attn.qk result must be !attn.scores<8> (q heads), got !attn.scores<2>

// -----

func.func @scale_zero(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.qk %q, %k scale = 0.0 : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk scale must be > 0 and finite, got 0.0

// -----

func.func @scale_negative(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.qk %q, %k scale = -0.125 : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk scale must be > 0 and finite, got -0.125

// -----

func.func @q_rank3(%q: tensor<?x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.qk %q, %k : tensor<?x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk q must be a rank-4 tensor [B, H, N, D], got tensor<?x?x64xf16>

// -----

func.func @k_int(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xi8>) {
  %s = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xi8> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk k must have a float element type, got tensor<?x8x?x64xi8>

// -----

func.func @k_dynamic_heads(%q: tensor<?x8x?x64xf16>, %k: tensor<?x?x?x64xf16>) {
  %s = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x?x?x64xf16> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk k must have static heads and head dim, got tensor<?x?x?x64xf16>

// -----

func.func @no_heads(%s: !attn.scores<0>) {
  func.return
}
// CHECK: !attn.scores needs at least one head, got 0
