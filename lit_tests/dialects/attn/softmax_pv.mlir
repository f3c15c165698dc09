// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// attn.softmax with and without a sink; attn.pv with as many v heads as query
// heads, with grouped v heads, and with a value head dim that differs from q/k's.

func.func @softmax_pv(%s: !attn.scores<8>, %sink: tensor<8xf32>, %v: tensor<?x8x?x64xf16>, %v2: tensor<?x2x?x96xf16>) {
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %ps = attn.softmax %s sink(%sink : tensor<8xf32>) : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf16>
  %o2 = attn.pv %ps, %v2 : !attn.probs<8>, tensor<?x2x?x96xf16> -> tensor<?x8x?x96xf32>
  func.return
}

// CHECK-LABEL: func.func @softmax_pv(
// CHECK-NEXT:    %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
// CHECK-NEXT:    %ps = attn.softmax %s sink(%sink : tensor<8xf32>) : !attn.scores<8> -> !attn.probs<8>
// CHECK-NEXT:    %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf16>
// CHECK-NEXT:    %o2 = attn.pv %ps, %v2 : !attn.probs<8>, tensor<?x2x?x96xf16> -> tensor<?x8x?x96xf32>
// CHECK-NEXT:    func.return

// CHECK-GENERIC:      %p = "attn.softmax"(%s) : (!attn.scores<8>) -> !attn.probs<8>
// CHECK-GENERIC-NEXT: %ps = "attn.softmax"(%s, %sink) : (!attn.scores<8>, tensor<8xf32>) -> !attn.probs<8>
// CHECK-GENERIC-NEXT: %o = "attn.pv"(%p, %v) : (!attn.probs<8>, tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xf16>
