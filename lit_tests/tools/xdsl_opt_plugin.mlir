// Stock xdsl-opt sees the attn dialect through the `xdsl.universe` entry point:
// it parses, verifies and prints attn IR in both forms, and reports attn's
// verifier diagnostics.

// RUN: xdsl-opt %s | filecheck %s
// RUN: xdsl-opt %s --print-op-generic | filecheck %s --check-prefix=GENERIC
// RUN: xdsl-opt %s --print-op-generic | attnfuse-opt | filecheck %s
// RUN: attnfuse-opt %s --print-op-generic | xdsl-opt | filecheck %s
// RUN: xdsl-opt %S/Inputs/verify_error.mlir --verify-diagnostics | filecheck %s --check-prefix=DIAG

func.func @sliding_softcap(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>, %sink: tensor<4xf32>) -> tensor<?x4x?x32xf16> {
  %qn = attn.norm %q eps = 1.0e-06 : tensor<?x4x?x32xf16>
  %qr = attn.rope %qn interleaved theta = 10000.0 rotary_dim = 16 scaling = #attn.rope_scaling<linear, factor = 2.0> : tensor<?x4x?x32xf16>
  %s = attn.qk %qr, %k scale = 0.25 : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %c = attn.softcap %s cap = 30.0 : !attn.scores<4>
  %m = attn.mask %c sliding_window(64) : !attn.scores<4>
  %p = attn.softmax %m sink(%sink : tensor<4xf32>) : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// CHECK-LABEL: func.func @sliding_softcap(
// CHECK-NEXT:    %qn = attn.norm %q eps = 1.0e-06 : tensor<?x4x?x32xf16>
// CHECK-NEXT:    %qr = attn.rope %qn interleaved theta = 10000.0 rotary_dim = 16 scaling = #attn.rope_scaling<linear, factor = 2.0> : tensor<?x4x?x32xf16>
// CHECK-NEXT:    %s = attn.qk %qr, %k scale = 0.25 : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
// CHECK-NEXT:    %c = attn.softcap %s cap = 30.0 : !attn.scores<4>
// CHECK-NEXT:    %m = attn.mask %c sliding_window(64) : !attn.scores<4>
// CHECK-NEXT:    %p = attn.softmax %m sink(%sink : tensor<4xf32>) : !attn.scores<4> -> !attn.probs<4>
// CHECK-NEXT:    %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
// CHECK-NEXT:    func.return %o : tensor<?x4x?x32xf16>

// GENERIC:      "attn.norm"(%q) <{eps = 1.000000e-06 : f64}>
// GENERIC:      "attn.softmax"(%m, %sink) : (!attn.scores<4>, tensor<4xf32>) -> !attn.probs<4>

// DIAG:      attn.qk q heads (8) must be a multiple of k heads (3)
// DIAG:      %s = "attn.qk"(%q, %k) : (tensor<?x8x?x64xf32>, tensor<?x3x?x64xf32>) -> !attn.scores<8>
// DIAG-NEXT: ^^^^^^^^^^^^^^
