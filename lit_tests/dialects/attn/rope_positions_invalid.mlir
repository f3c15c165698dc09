// RUN: ATTN_VERIFY

// One broken positions operand of attn.rope / attn.rope_grad per chunk; each must fail with
// the rule it breaks: positions are an integer tensor [N] or [B, N].

func.func @float_positions(%q: tensor<?x8x?x64xf32>, %pos: tensor<?x?xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 positions(%pos : tensor<?x?xf32>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope positions must be an integer tensor [N] or [B, N], got tensor<?x?xf32>

// -----

func.func @half_positions(%q: tensor<?x8x?x64xf16>, %pos: tensor<?xf16>) {
  %r = attn.rope %q interleaved theta = 10000.0 rotary_dim = 32 positions(%pos : tensor<?xf16>) : tensor<?x8x?x64xf16>
  func.return
}
// CHECK: attn.rope positions must be an integer tensor [N] or [B, N], got tensor<?xf16>

// -----

func.func @rank3(%q: tensor<?x8x?x64xf32>, %pos: tensor<?x1x?xi64>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 positions(%pos : tensor<?x1x?xi64>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope positions must be an integer tensor [N] or [B, N], got tensor<?x1x?xi64>

// -----

func.func @rank0(%q: tensor<?x8x?x64xf32>, %pos: tensor<i32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 positions(%pos : tensor<i32>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope positions must be an integer tensor [N] or [B, N], got tensor<i32>

// -----

// The generic form: the positions group of operandSegmentSizes.
func.func @generic_float(%q: tensor<?x8x?x64xf32>, %f: tensor<32xf32>, %pos: tensor<4x?xbf16>) {
  %r = "attn.rope"(%q, %f, %pos) <{theta = 1.0e+04 : f64, style = #attn<rope_style half>, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1>}> : (tensor<?x8x?x64xf32>, tensor<32xf32>, tensor<4x?xbf16>) -> tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope positions must be an integer tensor [N] or [B, N], got tensor<4x?xbf16>

// -----

// Positions in the inv_freq slot: an integer tensor is no frequency vector.
func.func @positions_as_inv_freq(%q: tensor<?x8x?x64xf32>, %pos: tensor<?x?xi64>) {
  %r = "attn.rope"(%q, %pos) <{theta = 1.0e+04 : f64, style = #attn<rope_style half>, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 0>}> : (tensor<?x8x?x64xf32>, tensor<?x?xi64>) -> tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope inv_freq must be tensor<32xf32> (rotary_dim / 2), got tensor<?x?xi64>

// -----

func.func @grad_float_positions(%dq: tensor<?x8x?x64xf32>, %pos: tensor<?x?xf64>) {
  %r = attn.rope_grad %dq half theta = 10000.0 rotary_dim = 64 positions(%pos : tensor<?x?xf64>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope_grad positions must be an integer tensor [N] or [B, N], got tensor<?x?xf64>

// -----

func.func @grad_rank3(%dk: tensor<?x2x?x64xf16>, %pos: tensor<2x2x?xi32>) {
  %r = attn.rope_grad %dk interleaved theta = 10000.0 rotary_dim = 64 positions(%pos : tensor<2x2x?xi32>) : tensor<?x2x?x64xf16>
  func.return
}
// CHECK: attn.rope_grad positions must be an integer tensor [N] or [B, N], got tensor<2x2x?xi32>
