// Invalid attn IR, one mistake per chunk, each annotated with the error attnfuse-opt reports:
//
//   attnfuse-opt bad.mlir --split-input-file --verify-diagnostics
//
// checks that every chunk fails with the annotated error (and only that one): the exit status is 0.
// Remove an annotation, or fix a chunk, and the exit status is 1.

// GQA: q's heads must be a multiple of k's.
func.func @gqa_heads(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x6x?x128xbf16>, %v: tensor<?x6x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  // expected-error @+1 {{q heads (32) must be a multiple of k heads (6)}}
  %s = attn.qk %q, %k : tensor<?x32x?x128xbf16>, tensor<?x6x?x128xbf16> -> !attn.scores<32>
  %p = attn.softmax %s : !attn.scores<32> -> !attn.probs<32>
  %o = attn.pv %p, %v : !attn.probs<32>, tensor<?x6x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}

// -----

// A rope scaling attribute must spell out every parameter: `...` is not one.
func.func @rope_scaling(%q: tensor<?x8x?x64xf32>) -> tensor<?x8x?x64xf32> {
  // expected-error @+1 {{a rope scaling parameter name}}
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0, ...> : tensor<?x8x?x64xf32>
  func.return %qr : tensor<?x8x?x64xf32>
}

// -----

// An option's `=` is part of the syntax.
func.func @softcap_syntax(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap 20.0 : !attn.scores<4> // expected-error {{Expected '='}}
  func.return
}

// -----

// SSA values must be defined before they are used.
func.func @use_before_def(%q: tensor<?x4x?x16xf32>, %k: tensor<?x4x?x16xf32>, %v: tensor<?x4x?x16xf32>) -> tensor<?x4x?x16xf32> {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x4x?x16xf32> -> !attn.scores<4>
  // expected-error @+1 {{uses %p (operand #0) before its definition}}
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x16xf32> -> tensor<?x4x?x16xf32>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  func.return %o : tensor<?x4x?x16xf32>
}
