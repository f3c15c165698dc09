// RUN: ATTN_VERIFY
// RUN: echo 'func.func @f(%q: tensor<?x8x?x64xf32>) { %r = attn.rope %q neox theta = 10000.0 rotary_dim = 64 : tensor<?x8x?x64xf32> func.return }' | not attnfuse-opt 2>&1 | filecheck %s --check-prefix=STYLE
// STYLE: attn.rope %q neox
// STYLE: Expected `half`, or `interleaved`.
// MLIR lexes `1e999` as the integer 1 and a name: the float parser says how to write it.
// RUN: echo 'func.func @f(%q: tensor<?x8x?x64xf32>) { %r = attn.rope %q half theta = 1e999 rotary_dim = 64 : tensor<?x8x?x64xf32> func.return }' | not attnfuse-opt 2>&1 | filecheck %s --check-prefix=EXPONENT
// EXPONENT: a float with an exponent needs a '.': write 1.0e999
// RUN: echo 'func.func @f(%q: tensor<?x8x?x64xf32>) { %r = attn.rope %q half theta = 1.0e999 rotary_dim = 64 : tensor<?x8x?x64xf32> func.return }' | not attnfuse-opt 2>&1 | filecheck %s --check-prefix=INF
// INF: attn.rope theta must be > 0 and finite, got inf

// One broken attn.rope per chunk; each must fail with the rule it breaks.

func.func @rank3(%q: tensor<?x8x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x8x64xf32>
  func.return
}
// CHECK: attn.rope input must be a rank-4 tensor [B, H, N, D], got tensor<?x8x64xf32>

// -----

func.func @dynamic_heads(%q: tensor<?x?x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x?x?x64xf32>
  func.return
}
// CHECK: attn.rope input must have static heads and head dim, got tensor<?x?x?x64xf32>

// -----

func.func @dynamic_head_dim(%q: tensor<?x8x?x?xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x8x?x?xf32>
  func.return
}
// CHECK: attn.rope input must have static heads and head dim, got tensor<?x8x?x?xf32>

// -----

func.func @int_elements(%q: tensor<?x8x?x64xi32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x8x?x64xi32>
  func.return
}
// CHECK: attn.rope input must have a float element type, got tensor<?x8x?x64xi32>

// -----

func.func @result_type(%q: tensor<?x8x?x64xf32>) {
  %r = "attn.rope"(%q) <{theta = 1.0e+04 : f64, style = #attn<rope_style half>, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<?x8x?x64xf32>) -> tensor<?x8x?x64xf16>
  func.return
}
// CHECK:      "attn.rope"
// CHECK:      Operation does not verify: result 'output' at position 0 does not verify:
// CHECK-NEXT: attribute tensor<?x8x?x64xf32> expected from variable 'T', but got tensor<?x8x?x64xf16>

// -----

func.func @rotary_dim_odd(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 33 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope rotary_dim must be even, positive and at most the head dim 64, got 33

// -----

func.func @rotary_dim_too_big(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q interleaved theta = 10000.0 rotary_dim = 128 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope rotary_dim must be even, positive and at most the head dim 64, got 128

// -----

func.func @rotary_dim_zero(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 0 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope rotary_dim must be even, positive and at most the head dim 64, got 0

// -----

func.func @theta_zero(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 0.0 rotary_dim = 64 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope theta must be > 0 and finite, got 0.0

// -----

func.func @theta_negative(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = -10000.0 rotary_dim = 64 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope theta must be > 0 and finite, got -10000.0

// -----

func.func @theta_infinite(%q: tensor<?x8x?x64xf32>) {
  %r = "attn.rope"(%q) <{theta = 0x7FF0000000000000 : f64, style = #attn<rope_style half>, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<?x8x?x64xf32>) -> tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope theta must be > 0 and finite, got inf

// -----

// The style is an enum: in the custom form a bad one is a parse error (the STYLE run
// line above); in the generic form, a verifier error.
func.func @bad_style(%q: tensor<?x8x?x64xf32>) {
  %r = "attn.rope"(%q) <{theta = 1.0e+04 : f64, style = "neox", rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<?x8x?x64xf32>) -> tensor<?x8x?x64xf32>
  func.return
}
// CHECK:      "attn.rope"(%q) <{theta = 1.000000e+04 : f64, style = "neox"
// CHECK:      Operation does not verify: "neox" should be of base attribute attn.rope_style

// -----

func.func @inv_freq_shape(%q: tensor<?x8x?x64xf32>, %f: tensor<32xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 32 inv_freq(%f : tensor<32xf32>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope inv_freq must be tensor<16xf32> (rotary_dim / 2), got tensor<32xf32>

// -----

func.func @inv_freq_int(%q: tensor<?x8x?x64xf32>, %f: tensor<32xi32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 inv_freq(%f : tensor<32xi32>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope inv_freq must be tensor<32xf32> (rotary_dim / 2), got tensor<32xi32>

// -----

func.func @inv_freq_and_scaling(%q: tensor<?x8x?x64xf32>, %f: tensor<32xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<linear, factor = 2.0> inv_freq(%f : tensor<32xf32>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope takes either an inv_freq operand or scaling
