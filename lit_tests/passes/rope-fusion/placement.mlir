// RUN: attnfuse-opt %s --split-input-file -p 'rope-fusion{seq-len=64}' | filecheck %s

// rope-fusion marks where each pre-matmul op runs: every op of q's chain in the Q
// prologue, every op of k's chain in the KV loop (fused) or in a pre-rotation kernel.
// It only adds attributes: the ops, their order and the score chain stay as they were.

// Qwen3: QK-norm with weights, then RoPE, and an extra q scale.
func.func @qwen3(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %qw: tensor<64xf16>, %kw: tensor<64xf16>) -> tensor<?x4x?x64xf16> {
  %qn = attn.norm %q eps = 1.0e-06 weight(%qw : tensor<64xf16>) : tensor<?x4x?x64xf16>
  %kn = attn.norm %k eps = 1.0e-06 weight(%kw : tensor<64xf16>) : tensor<?x2x?x64xf16>
  %qr = attn.rope %qn half theta = 1000000.0 rotary_dim = 64 : tensor<?x4x?x64xf16>
  %kr = attn.rope %kn half theta = 1000000.0 rotary_dim = 64 : tensor<?x2x?x64xf16>
  %qs = attn.scale %qr value = 2.0 : tensor<?x4x?x64xf16>
  %s = attn.qk %qs, %kr : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// CHECK-LABEL: func.func @qwen3(
// CHECK-SAME:    attributes {attn.rope_fusion = {k = "kv_loop", sm = 90 : i64, seq_len = 64 : i64, fused_us = {{.*}} : f64, prerotate_us = {{.*}} : f64}}
// CHECK-NEXT:    %qn = attn.norm %q eps = 1.0e-06 weight(%qw : tensor<64xf16>) {placement = #attn.placement<q_prologue>} : tensor<?x4x?x64xf16>
// CHECK-NEXT:    %kn = attn.norm %k eps = 1.0e-06 weight(%kw : tensor<64xf16>) {placement = #attn.placement<kv_loop>} : tensor<?x2x?x64xf16>
// CHECK-NEXT:    %qr = attn.rope %qn half theta = 1000000.0 rotary_dim = 64 {placement = #attn.placement<q_prologue>} : tensor<?x4x?x64xf16>
// CHECK-NEXT:    %kr = attn.rope %kn half theta = 1000000.0 rotary_dim = 64 {placement = #attn.placement<kv_loop>} : tensor<?x2x?x64xf16>
// CHECK-NEXT:    %qs = attn.scale %qr value = 2.0 {placement = #attn.placement<q_prologue>} : tensor<?x4x?x64xf16>
// 1/sqrt(64) * log2(e): the log2 e factor of the base-2 softmax is folded into q.
// CHECK-NEXT:    %s = attn.qk %qs, %kr {score_scale = 0.18033688011112042 : f64, log2e_folded} : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
// CHECK-NEXT:    %m = attn.mask %s causal : !attn.scores<4>
// CHECK-NEXT:    %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
// CHECK-NEXT:    %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
// CHECK-NEXT:    func.return %o : tensor<?x4x?x64xf16>

// -----

// Nothing transforms k: no decision to make, and no cost model is run.
func.func @q_only(%q: tensor<?x4x?x32xf32>, %k: tensor<?x4x?x32xf32>, %v: tensor<?x4x?x32xf32>) -> tensor<?x4x?x32xf32> {
  %qr = attn.rope %q interleaved theta = 10000.0 rotary_dim = 16 : tensor<?x4x?x32xf32>
  %s = attn.qk %qr, %k : tensor<?x4x?x32xf32>, tensor<?x4x?x32xf32> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x32xf32> -> tensor<?x4x?x32xf32>
  func.return %o : tensor<?x4x?x32xf32>
}

// CHECK-LABEL: func.func @q_only(
// CHECK-SAME:    attributes {attn.rope_fusion = {k = "none"}}
// CHECK-NEXT:    %qr = attn.rope %q interleaved theta = 10000.0 rotary_dim = 16 {placement = #attn.placement<q_prologue>} : tensor<?x4x?x32xf32>
// CHECK-NEXT:    %s = attn.qk %qr, %k {score_scale = 0.25503486164919736 : f64, log2e_folded} : tensor<?x4x?x32xf32>, tensor<?x4x?x32xf32> -> !attn.scores<4>
// CHECK-NEXT:    %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>

// -----

// No pre-matmul op at all: only the scale is placed.
func.func @plain(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @plain(
// CHECK-SAME:    attributes {attn.rope_fusion = {k = "none"}}
// CHECK-NEXT:    %s = attn.qk %q, %k {score_scale = 0.36067376022224085 : f64, log2e_folded}
