// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// The FP8 form's ops: attn.hadamard (the same seed on q and k) and attn.quantize (e4m3, per
// block of rows or per tensor) on q, k and v, in the order a variant writes them.

func.func @fp8(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>) -> tensor<?x8x?x128xbf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %qh = attn.hadamard %qr seed = 7 : tensor<?x8x?x128xbf16>
  %q8 = attn.quantize %qh e4m3 block = 128 : tensor<?x8x?x128xbf16>
  %kh = attn.hadamard %k seed = 7 : tensor<?x2x?x128xbf16>
  %k8 = attn.quantize %kh e4m3 block = 128 {placement = #attn.placement<prerotate>} : tensor<?x2x?x128xbf16>
  %v8 = attn.quantize %v e4m3 block = 0 : tensor<?x2x?x128xbf16>
  %s = attn.qk %q8, %k8 : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v8 : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// CHECK-LABEL: func.func @fp8(
// CHECK:         %qh = attn.hadamard %qr seed = 7 : tensor<?x8x?x128xbf16>
// CHECK-NEXT:    %q8 = attn.quantize %qh e4m3 block = 128 : tensor<?x8x?x128xbf16>
// CHECK-NEXT:    %kh = attn.hadamard %k seed = 7 : tensor<?x2x?x128xbf16>
// CHECK-NEXT:    %k8 = attn.quantize %kh e4m3 block = 128 {placement = #attn.placement<prerotate>} : tensor<?x2x?x128xbf16>
// CHECK-NEXT:    %v8 = attn.quantize %v e4m3 block = 0 : tensor<?x2x?x128xbf16>

// CHECK-GENERIC-LABEL: "func.func"() <{sym_name = "fp8"
// CHECK-GENERIC:         "attn.hadamard"(%{{.*}}) <{seed = 7 : i64}> : (tensor<?x8x?x128xbf16>) -> tensor<?x8x?x128xbf16>
// CHECK-GENERIC:         "attn.quantize"(%{{.*}}) <{block = 128 : i64}> : (tensor<?x8x?x128xbf16>) -> tensor<?x8x?x128xbf16>
