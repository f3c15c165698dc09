// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// attn.rope and attn.rope_grad at explicit positions: the optional `positions` operand, an
// integer tensor [B, N] or [N] (i64 or i32, static or dynamic sizes) giving the position
// of each of the input's N rows, alone, after inv_freq, with scaling, and with a
// discardable attribute. The generic form counts the operands of each group
// (input, inv_freq, positions) in operandSegmentSizes.

func.func @rope_positions(%q: tensor<?x8x?x64xf16>, %k: tensor<2x2x?x64xbf16>, %f: tensor<16xf32>, %qpos: tensor<?x?xi64>, %kpos: tensor<2x?xi32>, %shared: tensor<?xi64>, %fixed: tensor<128xi32>) {
  %q_b = attn.rope %q half theta = 10000.0 rotary_dim = 64 positions(%qpos : tensor<?x?xi64>) : tensor<?x8x?x64xf16>
  %k_b = attn.rope %k interleaved theta = 10000.0 rotary_dim = 64 positions(%kpos : tensor<2x?xi32>) : tensor<2x2x?x64xbf16>
  %q_n = attn.rope %q half theta = 500000.0 rotary_dim = 32 positions(%shared : tensor<?xi64>) : tensor<?x8x?x64xf16>
  %k_n = attn.rope %k half theta = 10000.0 rotary_dim = 64 positions(%fixed : tensor<128xi32>) : tensor<2x2x?x64xbf16>
  %both = attn.rope %q half theta = 10000.0 rotary_dim = 32 inv_freq(%f : tensor<16xf32>) positions(%qpos : tensor<?x?xi64>) : tensor<?x8x?x64xf16>
  %llama3 = attn.rope %q half theta = 500000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0> positions(%qpos : tensor<?x?xi64>) : tensor<?x8x?x64xf16>
  %tagged = attn.rope %k half theta = 10000.0 rotary_dim = 64 positions(%kpos : tensor<2x?xi32>) {note = "k"} : tensor<2x2x?x64xbf16>
  %dq = attn.rope_grad %q half theta = 10000.0 rotary_dim = 64 positions(%qpos : tensor<?x?xi64>) : tensor<?x8x?x64xf16>
  %dk = attn.rope_grad %k interleaved theta = 10000.0 rotary_dim = 32 inv_freq(%f : tensor<16xf32>) positions(%shared : tensor<?xi64>) : tensor<2x2x?x64xbf16>
  func.return
}

// CHECK-LABEL: func.func @rope_positions(%q: tensor<?x8x?x64xf16>, %k: tensor<2x2x?x64xbf16>, %f: tensor<16xf32>, %qpos: tensor<?x?xi64>, %kpos: tensor<2x?xi32>, %shared: tensor<?xi64>, %fixed: tensor<128xi32>) {
// CHECK-NEXT:    %q_b = attn.rope %q half theta = 10000.0 rotary_dim = 64 positions(%qpos : tensor<?x?xi64>) : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %k_b = attn.rope %k interleaved theta = 10000.0 rotary_dim = 64 positions(%kpos : tensor<2x?xi32>) : tensor<2x2x?x64xbf16>
// CHECK-NEXT:    %q_n = attn.rope %q half theta = 500000.0 rotary_dim = 32 positions(%shared : tensor<?xi64>) : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %k_n = attn.rope %k half theta = 10000.0 rotary_dim = 64 positions(%fixed : tensor<128xi32>) : tensor<2x2x?x64xbf16>
// CHECK-NEXT:    %both = attn.rope %q half theta = 10000.0 rotary_dim = 32 inv_freq(%f : tensor<16xf32>) positions(%qpos : tensor<?x?xi64>) : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %llama3 = attn.rope %q half theta = 500000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0> positions(%qpos : tensor<?x?xi64>) : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %tagged = attn.rope %k half theta = 10000.0 rotary_dim = 64 positions(%kpos : tensor<2x?xi32>) {note = "k"} : tensor<2x2x?x64xbf16>
// CHECK-NEXT:    %dq = attn.rope_grad %q half theta = 10000.0 rotary_dim = 64 positions(%qpos : tensor<?x?xi64>) : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %dk = attn.rope_grad %k interleaved theta = 10000.0 rotary_dim = 32 inv_freq(%f : tensor<16xf32>) positions(%shared : tensor<?xi64>) : tensor<2x2x?x64xbf16>
// CHECK-NEXT:    func.return
// CHECK-NEXT:  }

// CHECK-GENERIC:      "attn.rope"(%q, %qpos) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 1>}> : (tensor<?x8x?x64xf16>, tensor<?x?xi64>) -> tensor<?x8x?x64xf16>
// CHECK-GENERIC-NEXT: "attn.rope"(%k, %kpos) <{style = #attn<rope_style interleaved>, theta = 1.000000e+04 : f64, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 1>}> : (tensor<2x2x?x64xbf16>, tensor<2x?xi32>) -> tensor<2x2x?x64xbf16>
// CHECK-GENERIC-NEXT: "attn.rope"(%q, %shared) <{style = #attn<rope_style half>, theta = 5.000000e+05 : f64, rotary_dim = 32 : i64, operandSegmentSizes = array<i32: 1, 0, 1>}> : (tensor<?x8x?x64xf16>, tensor<?xi64>) -> tensor<?x8x?x64xf16>
// CHECK-GENERIC-NEXT: "attn.rope"(%k, %fixed) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 1>}> : (tensor<2x2x?x64xbf16>, tensor<128xi32>) -> tensor<2x2x?x64xbf16>
// CHECK-GENERIC-NEXT: "attn.rope"(%q, %f, %qpos) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 32 : i64, operandSegmentSizes = array<i32: 1, 1, 1>}> : (tensor<?x8x?x64xf16>, tensor<16xf32>, tensor<?x?xi64>) -> tensor<?x8x?x64xf16>
// CHECK-GENERIC-NEXT: "attn.rope"(%q, %qpos) <{style = #attn<rope_style half>, theta = 5.000000e+05 : f64, rotary_dim = 64 : i64, scaling = #attn.rope_scaling<llama3, factor = 8.0>, operandSegmentSizes = array<i32: 1, 0, 1>}>
// CHECK-GENERIC-NEXT: "attn.rope"(%k, %kpos) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 1>}> {note = "k"}
// CHECK-GENERIC-NEXT: "attn.rope_grad"(%q, %qpos) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 1>}> : (tensor<?x8x?x64xf16>, tensor<?x?xi64>) -> tensor<?x8x?x64xf16>
// CHECK-GENERIC-NEXT: "attn.rope_grad"(%k, %f, %shared) <{style = #attn<rope_style interleaved>, theta = 1.000000e+04 : f64, rotary_dim = 32 : i64, operandSegmentSizes = array<i32: 1, 1, 1>}> : (tensor<2x2x?x64xbf16>, tensor<16xf32>, tensor<?xi64>) -> tensor<2x2x?x64xbf16>
