// RUN: attnfuse-opt %s --split-input-file -p rope-fusion | filecheck %s

// score_scale is the factor the kernels multiply Q·Kᵀ's fp32 scores by (never q or k
// before the product, which would round the scaled tile to 16 bits): attn.qk's scale
// (default 1/sqrt(D)) times log2(e) when the base-2 softmax's factor can be folded,
// i.e. when every score op is linear in the score (attn.scale, attn.mask); attn.qk is
// then also marked `log2e_folded`. A softcap, bias or score_mod sees natural-unit
// scores, so log2(e) is not folded then.

// Default scale 1/sqrt(64) = 0.125, times log2(e).
func.func @default_scale(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}
// CHECK-LABEL: func.func @default_scale(
// CHECK:         attn.qk %q, %k {score_scale = 0.18033688011112042 : f64, log2e_folded}

// -----

// An explicit scale, then a score scale and a mask: still linear, folded.
func.func @explicit_scale(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> {
  %s = attn.qk %q, %k scale = 0.5 : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %t = attn.scale %s value = 3.0 : !attn.scores<2>
  %m = attn.mask %t causal : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}
// CHECK-LABEL: func.func @explicit_scale(
// CHECK:         attn.qk %q, %k scale = 0.5 {score_scale = 0.72134752044448169 : f64, log2e_folded}
// The score scale stays where it is (no placement: it is not a pre-matmul op).
// CHECK-NEXT:    %t = attn.scale %s value = 3.0 : !attn.scores<2>
// CHECK-NEXT:    %m = attn.mask %t causal : !attn.scores<2>

// -----

// Softcap (Gemma 2): tanh needs natural-unit scores, so only the scale is folded.
func.func @softcap(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %c = attn.softcap %s cap = 50.0 : !attn.scores<2>
  %m = attn.mask %c causal : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}
// CHECK-LABEL: func.func @softcap(
// CHECK:         attn.qk %q, %k {score_scale = 1.250000e-01 : f64}
// CHECK-NEXT:    %c = attn.softcap %s cap = 50.0 : !attn.scores<2>

// -----

// ALiBi adds natural-unit values: not folded.
func.func @alibi(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %slopes: tensor<2xf32>) -> tensor<?x2x?x64xf16> {
  %s = attn.qk %q, %k scale = 0.25 : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %b = attn.bias %s alibi(%slopes : tensor<2xf32>) : !attn.scores<2>
  %p = attn.softmax %b : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}
// CHECK-LABEL: func.func @alibi(
// CHECK:         attn.qk %q, %k scale = 0.25 {score_scale = 2.500000e-01 : f64}

// -----

// A score_mod region: not folded.
func.func @score_mod(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %t = attn.score_mod %s {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %y = math.tanh %x : f32
    attn.yield %y : f32
  } : !attn.scores<2>
  %p = attn.softmax %t : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
// CHECK-LABEL: func.func @score_mod(
// CHECK:         attn.qk %q, %k {score_scale = 2.500000e-01 : f64}
