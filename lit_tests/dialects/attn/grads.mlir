// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// The derivative ops of a backward function (attn-autodiff writes them), each in its
// custom form: pv_grad, softmax_grad, sink_grad, score_mul, qk_grad, rope_grad,
// norm_grad (with and without a weight) and norm_weight_grad.

func.func @grads(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x16xf16>, %w: tensor<32xf32>, %sink: tensor<4xf32>, %out: tensor<?x4x?x16xf16>, %lse: tensor<?x4x?xf32>, %dout: tensor<?x4x?x16xf16>, %freq: tensor<8xf32>) {
  %s = attn.qk %q, %k : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %p = attn.softmax %s sink(%sink : tensor<4xf32>) : !attn.scores<4> -> !attn.probs<4>
  %dp, %dv = attn.pv_grad %p, %v, %dout : !attn.probs<4>, tensor<?x2x?x16xf16>, tensor<?x4x?x16xf16> -> !attn.scores<4>
  %ds = attn.softmax_grad %p, %dp, %out, %dout : !attn.probs<4>, !attn.scores<4>, tensor<?x4x?x16xf16>, tensor<?x4x?x16xf16> -> !attn.scores<4>
  %dsink = attn.sink_grad %sink, %lse, %out, %dout : tensor<4xf32>, tensor<?x4x?xf32>, tensor<?x4x?x16xf16>, tensor<?x4x?x16xf16>
  %ds2 = attn.score_mul %ds, %ds : !attn.scores<4>
  %dq, %dk = attn.qk_grad %ds2, %q, %k scale = 0.125 : !attn.scores<4>, tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16>
  %dq1 = attn.rope_grad %dq half theta = 10000.0 rotary_dim = 32 : tensor<?x4x?x32xf16>
  %dk1 = attn.rope_grad %dk interleaved theta = 10000.0 rotary_dim = 16 inv_freq(%freq : tensor<8xf32>) : tensor<?x2x?x32xf16>
  %dq2 = attn.norm_grad %dq1, %q eps = 1.0e-06 weight(%w : tensor<32xf32>) : tensor<?x4x?x32xf16>, tensor<?x4x?x32xf16>
  %dk2 = attn.norm_grad %dk1, %k eps = 1.0e-05 : tensor<?x2x?x32xf16>, tensor<?x2x?x32xf16>
  %dw = attn.norm_weight_grad %dq1, %q eps = 1.0e-06 : tensor<?x4x?x32xf16>, tensor<?x4x?x32xf16> -> tensor<32xf32>
  func.return
}

// CHECK-LABEL: func.func @grads(
// CHECK:         %dp, %dv = attn.pv_grad %p, %v, %dout : !attn.probs<4>, tensor<?x2x?x16xf16>, tensor<?x4x?x16xf16> -> !attn.scores<4>
// CHECK-NEXT:    %ds = attn.softmax_grad %p, %dp, %out, %dout : !attn.probs<4>, !attn.scores<4>, tensor<?x4x?x16xf16>, tensor<?x4x?x16xf16> -> !attn.scores<4>
// CHECK-NEXT:    %dsink = attn.sink_grad %sink, %lse, %out, %dout : tensor<4xf32>, tensor<?x4x?xf32>, tensor<?x4x?x16xf16>, tensor<?x4x?x16xf16>
// CHECK-NEXT:    %ds2 = attn.score_mul %ds, %ds : !attn.scores<4>
// CHECK-NEXT:    %dq, %dk = attn.qk_grad %ds2, %q, %k scale = 0.125 : !attn.scores<4>, tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16>
// CHECK-NEXT:    %dq1 = attn.rope_grad %dq half theta = 10000.0 rotary_dim = 32 : tensor<?x4x?x32xf16>
// CHECK-NEXT:    %dk1 = attn.rope_grad %dk interleaved theta = 10000.0 rotary_dim = 16 inv_freq(%freq : tensor<8xf32>) : tensor<?x2x?x32xf16>
// CHECK-NEXT:    %dq2 = attn.norm_grad %dq1, %q eps = 1.0e-06 weight(%w : tensor<32xf32>) : tensor<?x4x?x32xf16>, tensor<?x4x?x32xf16>
// CHECK-NEXT:    %dk2 = attn.norm_grad %dk1, %k eps = 1.0e-05 : tensor<?x2x?x32xf16>, tensor<?x2x?x32xf16>
// CHECK-NEXT:    %dw = attn.norm_weight_grad %dq1, %q eps = 1.0e-06 : tensor<?x4x?x32xf16>, tensor<?x4x?x32xf16> -> tensor<32xf32>
// CHECK-NEXT:    func.return

// CHECK-GENERIC: "attn.pv_grad"(%p, %v, %dout) : (!attn.probs<4>, tensor<?x2x?x16xf16>, tensor<?x4x?x16xf16>) -> (!attn.scores<4>, tensor<?x2x?x16xf16>)
// CHECK-GENERIC: "attn.qk_grad"(%ds2, %q, %k) <{scale = 1.250000e-01 : f64}>
