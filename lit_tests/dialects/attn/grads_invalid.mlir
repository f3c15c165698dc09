// RUN: ATTN_VERIFY

// Broken derivative ops, one per chunk.

func.func @pv_grad_dout_heads(%p: !attn.probs<4>, %v: tensor<?x2x?x16xf16>, %dout: tensor<?x2x?x16xf16>) {
  %dp, %dv = attn.pv_grad %p, %v, %dout : !attn.probs<4>, tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<4>
  func.return
}
// CHECK: attn.pv_grad dout must have 4 heads and head dim 16, got tensor<?x2x?x16xf16>

// -----

func.func @softmax_grad_dp_heads(%p: !attn.probs<4>, %dp: !attn.scores<2>, %o: tensor<?x4x?x16xf16>) {
  %ds = attn.softmax_grad %p, %dp, %o, %o : !attn.probs<4>, !attn.scores<2>, tensor<?x4x?x16xf16>, tensor<?x4x?x16xf16> -> !attn.scores<2>
  func.return
}
// CHECK: attn.softmax_grad dp must be !attn.scores<4>, got !attn.scores<2>

// -----

func.func @sink_grad_heads(%sink: tensor<2xf32>, %lse: tensor<?x4x?xf32>, %o: tensor<?x4x?x16xf16>) {
  %d = attn.sink_grad %sink, %lse, %o, %o : tensor<2xf32>, tensor<?x4x?xf32>, tensor<?x4x?x16xf16>, tensor<?x4x?x16xf16>
  func.return
}
// CHECK: attn.sink_grad sink must be a float tensor<4x...> (one logit per query head), got tensor<2xf32>

// -----

func.func @qk_grad_heads(%ds: !attn.scores<2>, %q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>) {
  %dq, %dk = attn.qk_grad %ds, %q, %k scale = 0.125 : !attn.scores<2>, tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16>
  func.return
}
// CHECK: attn.qk_grad ds must be !attn.scores<4>, got !attn.scores<2>

// -----

func.func @rope_grad_odd(%g: tensor<?x4x?x32xf16>) {
  %d = attn.rope_grad %g half theta = 10000.0 rotary_dim = 15 : tensor<?x4x?x32xf16>
  func.return
}
// CHECK: attn.rope_grad rotary_dim must be even, positive and at most 32, got 15

// -----

func.func @norm_grad_weight(%g: tensor<?x4x?x32xf16>, %w: tensor<16xf32>) {
  %d = attn.norm_grad %g, %g eps = 1.0e-06 weight(%w : tensor<16xf32>) : tensor<?x4x?x32xf16>, tensor<?x4x?x32xf16>
  func.return
}
// CHECK: attn.norm_grad weight must be a float tensor<32x...> (the head dim), got tensor<16xf32>

// -----

func.func @norm_weight_grad_shape(%g: tensor<?x4x?x32xf16>) {
  %d = attn.norm_weight_grad %g, %g eps = 1.0e-06 : tensor<?x4x?x32xf16>, tensor<?x4x?x32xf16> -> tensor<16xf32>
  func.return
}
// CHECK: attn.norm_weight_grad result must be a float tensor<32x...> (the head dim), got tensor<16xf32>
