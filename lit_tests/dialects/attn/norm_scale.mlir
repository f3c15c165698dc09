// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// attn.norm with and without a weight; attn.scale on q/k tensors (before the
// matmul) and on scores (after it); attn.softcap. Floats keep their exact value
// through both forms, including ones printed with an exponent.

func.func @pre(%q: tensor<?x16x?x128xbf16>, %w: tensor<128xf32>, %wh: tensor<128xbf16>) {
  %n = attn.norm %q eps = 1.0e-06 : tensor<?x16x?x128xbf16>
  %nw = attn.norm %q eps = 1.0e-05 weight(%w : tensor<128xf32>) : tensor<?x16x?x128xbf16>
  %nh = attn.norm %q eps = 0.001 weight(%wh : tensor<128xbf16>) : tensor<?x16x?x128xbf16>
  %sq = attn.scale %q value = 0.08838834764831845 : tensor<?x16x?x128xbf16>
  %neg = attn.scale %q value = -2.0 : tensor<?x16x?x128xbf16>
  %big = attn.scale %q value = 1.0e+20 : tensor<?x16x?x128xbf16>
  func.return
}

// CHECK-LABEL: func.func @pre(
// CHECK-NEXT:    %n = attn.norm %q eps = 1.0e-06 : tensor<?x16x?x128xbf16>
// CHECK-NEXT:    %nw = attn.norm %q eps = 1.0e-05 weight(%w : tensor<128xf32>) : tensor<?x16x?x128xbf16>
// CHECK-NEXT:    %nh = attn.norm %q eps = 0.001 weight(%wh : tensor<128xbf16>) : tensor<?x16x?x128xbf16>
// CHECK-NEXT:    %sq = attn.scale %q value = 0.08838834764831845 : tensor<?x16x?x128xbf16>
// CHECK-NEXT:    %neg = attn.scale %q value = -2.0 : tensor<?x16x?x128xbf16>
// CHECK-NEXT:    %big = attn.scale %q value = 1.0e+20 : tensor<?x16x?x128xbf16>
// CHECK-NEXT:    func.return

// CHECK-GENERIC-LABEL: "func.func"() <{sym_name = "pre"
// CHECK-GENERIC:         "attn.norm"(%q) <{eps = 1.000000e-06 : f64}> : (tensor<?x16x?x128xbf16>) -> tensor<?x16x?x128xbf16>
// CHECK-GENERIC-NEXT:    "attn.norm"(%q, %w) <{eps = 1.000000e-05 : f64}> : (tensor<?x16x?x128xbf16>, tensor<128xf32>) -> tensor<?x16x?x128xbf16>
// CHECK-GENERIC:         "attn.scale"(%q) <{value = -2.000000e+00 : f64}>

// -----

func.func @post(%s: !attn.scores<4>) {
  %a = attn.scale %s value = 0.5 : !attn.scores<4>
  %b = attn.softcap %a cap = 50.0 : !attn.scores<4>
  %c = attn.softcap %b cap = 0.25 {origin = "gemma2"} : !attn.scores<4>
  func.return
}

// CHECK-LABEL: func.func @post(%s: !attn.scores<4>) {
// CHECK-NEXT:    %a = attn.scale %s value = 0.5 : !attn.scores<4>
// CHECK-NEXT:    %b = attn.softcap %a cap = 50.0 : !attn.scores<4>
// CHECK-NEXT:    %c = attn.softcap %b cap = 0.25 {origin = "gemma2"} : !attn.scores<4>
// CHECK-NEXT:    func.return

// CHECK-GENERIC-LABEL: "func.func"() <{sym_name = "post"
// CHECK-GENERIC:         "attn.scale"(%s) <{value = 5.000000e-01 : f64}> : (!attn.scores<4>) -> !attn.scores<4>
// CHECK-GENERIC-NEXT:    "attn.softcap"(%a) <{cap = 5.000000e+01 : f64}> : (!attn.scores<4>) -> !attn.scores<4>
// CHECK-GENERIC-NEXT:    "attn.softcap"(%b) <{cap = 2.500000e-01 : f64}> {origin = "gemma2"} : (!attn.scores<4>) -> !attn.scores<4>
