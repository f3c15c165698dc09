// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// attn.qk with the default scale and an explicit one; multi-head, grouped-query
// (GQA) and multi-query (MQA) head layouts; static and dynamic batch.

func.func @qk(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>, %k2: tensor<?x2x?x64xf16>, %k1: tensor<?x1x?x64xf16>, %qs: tensor<3x4x?x32xf32>, %ks: tensor<3x4x?x32xf32>) {
  %mha = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<8>
  %scaled = attn.qk %q, %k scale = 0.125 : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<8>
  %gqa = attn.qk %q, %k2 : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<8>
  %mqa = attn.qk %q, %k1 scale = 1.0 : tensor<?x8x?x64xf16>, tensor<?x1x?x64xf16> -> !attn.scores<8>
  %static = attn.qk %qs, %ks {tag} : tensor<3x4x?x32xf32>, tensor<3x4x?x32xf32> -> !attn.scores<4>
  func.return
}

// CHECK-LABEL: func.func @qk(
// CHECK-NEXT:    %mha = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<8>
// CHECK-NEXT:    %scaled = attn.qk %q, %k scale = 0.125 : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<8>
// CHECK-NEXT:    %gqa = attn.qk %q, %k2 : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<8>
// CHECK-NEXT:    %mqa = attn.qk %q, %k1 scale = 1.0 : tensor<?x8x?x64xf16>, tensor<?x1x?x64xf16> -> !attn.scores<8>
// CHECK-NEXT:    %static = attn.qk %qs, %ks {tag} : tensor<3x4x?x32xf32>, tensor<3x4x?x32xf32> -> !attn.scores<4>
// CHECK-NEXT:    func.return

// The default scale is no property at all; an explicit one is an f64 property.
// CHECK-GENERIC:      %mha = "attn.qk"(%q, %k) : (tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16>) -> !attn.scores<8>
// CHECK-GENERIC-NEXT: %scaled = "attn.qk"(%q, %k) <{scale = 1.250000e-01 : f64}> : (tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16>) -> !attn.scores<8>
// CHECK-GENERIC-NEXT: %gqa = "attn.qk"(%q, %k2) : (tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16>) -> !attn.scores<8>
