// attn-autodiff replaces @f by @f_grad(args..., out, lse, dout): the forward's ops,
// recomputed, then each block's derivative in reverse order. The score gradient goes
// back through softcap (its derivative is a score_mod of the capped score, multiplied
// in) and passes the causal mask unchanged; q's norm weight and the sink get gradients.

// RUN: attnfuse-opt %s -p attn-autodiff | filecheck %s

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>, %w: tensor<32xf32>, %sink: tensor<4xf32>) -> tensor<?x4x?x32xf16> {
  %qn = attn.norm %q eps = 1.0e-06 weight(%w : tensor<32xf32>) : tensor<?x4x?x32xf16>
  %qr = attn.rope %qn half theta = 10000.0 rotary_dim = 32 : tensor<?x4x?x32xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 32 : tensor<?x2x?x32xf16>
  %s = attn.qk %qr, %kr : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %c = attn.softcap %s cap = 30.0 : !attn.scores<4>
  %m = attn.mask %c causal : !attn.scores<4>
  %p = attn.softmax %m sink(%sink : tensor<4xf32>) : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// CHECK:       func.func @f_grad(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>, %w: tensor<32xf32>, %sink: tensor<4xf32>, %out: tensor<?x4x?x32xf16>, %lse: tensor<?x4x?xf32>, %dout: tensor<?x4x?x32xf16>) -> (tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16>, tensor<?x2x?x32xf16>, tensor<32xf32>, tensor<4xf32>) attributes {attn.wrt = array<i64: 0, 1, 2, 3, 4>} {
// CHECK-NEXT:    %qn = attn.norm %q
// CHECK-NEXT:    %qr = attn.rope %qn
// CHECK-NEXT:    %kr = attn.rope %k
// CHECK-NEXT:    %s = attn.qk %qr, %kr
// CHECK-NEXT:    %c = attn.softcap %s cap = 30.0
// CHECK-NEXT:    %m = attn.mask %c causal
// CHECK-NEXT:    %p = attn.softmax %m sink(%sink : tensor<4xf32>)
// CHECK-NEXT:    %dp, %dv = attn.pv_grad %p, %v, %dout
// CHECK-NEXT:    %dm = attn.softmax_grad %p, %dp, %out, %dout
// CHECK-NEXT:    %dsink = attn.sink_grad %sink, %lse, %out, %dout
// CHECK-NEXT:    %dc_ds = attn.score_mod %c {
// CHECK-NEXT:    ^bb0(%0: f32, %1: i32, %2: i32, %3: i32, %4: i32):
// CHECK-NEXT:      %5 = arith.constant 3.000000e+01 : f32
// CHECK-NEXT:      %6 = arith.divf %0, %5 : f32
// CHECK-NEXT:      %7 = arith.mulf %6, %6 : f32
// CHECK-NEXT:      %8 = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:      %9 = arith.subf %8, %7 : f32
// CHECK-NEXT:      attn.yield %9 : f32
// CHECK-NEXT:    } : !attn.scores<4>
// CHECK-NEXT:    %ds = attn.score_mul %dm, %dc_ds : !attn.scores<4>
// CHECK-NEXT:    %dqr, %dkr = attn.qk_grad %ds, %qr, %kr scale = 0.17677669529663687
// CHECK-NEXT:    %dqn = attn.rope_grad %dqr half theta = 10000.0 rotary_dim = 32
// CHECK-NEXT:    %dw = attn.norm_weight_grad %dqn, %q eps = 1.0e-06 {{.*}} -> tensor<32xf32>
// CHECK-NEXT:    %dq = attn.norm_grad %dqn, %q eps = 1.0e-06 weight(%w : tensor<32xf32>)
// CHECK-NEXT:    %dk = attn.rope_grad %dkr half theta = 10000.0 rotary_dim = 32
// CHECK-NEXT:    func.return %dq, %dk, %dv, %dw, %dsink
// CHECK-NOT:   func.func @f(
