// RUN: attnfuse-opt %s --split-input-file -p causal-split | filecheck %s

// Several masks are a conjunction: each is classified on its own, in chain order, and
// the kernel intersects their bounds. One opaque member keeps the bounded ones (their
// bounds still skip blocks) but makes every visited block masked.

// Mistral / Gemma local layers: causal and a sliding window, a softcap in between.
func.func @causal_window(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s causal : !attn.scores<2>
  %c = attn.softcap %m cap = 50.0 : !attn.scores<2>
  %w = attn.mask %c sliding_window(4096) : !attn.scores<2>
  %p = attn.softmax %w : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @causal_window(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<causal>, #attn.kv_bound<sliding_window(4096)>]}
// CHECK:         %m = attn.mask %s causal attributes {blocks = #attn.kv_bound<causal>} : !attn.scores<2>
// CHECK-NEXT:    %c = attn.softcap %m cap = 50.0 : !attn.scores<2>
// CHECK-NEXT:    %w = attn.mask %c sliding_window(4096) attributes {blocks = #attn.kv_bound<sliding_window(4096)>} : !attn.scores<2>

// -----

func.func @prefix_window(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s prefix_lm(16) : !attn.scores<2>
  %w = attn.mask %m sliding_window(32) : !attn.scores<2>
  %p = attn.softmax %w : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @prefix_window(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<prefix_lm(16)>, #attn.kv_bound<sliding_window(32)>]}

// -----

// Packed documents with a causal mask: causal bounds, opaque document.
func.func @causal_document(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>, %ids: tensor<?x?xi32>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s causal : !attn.scores<2>
  %d = attn.mask %m document(%ids : tensor<?x?xi32>) : !attn.scores<2>
  %p = attn.softmax %d : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @causal_document(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<causal>, #attn.kv_bound<opaque>]}
// CHECK:         %m = attn.mask %s causal attributes {blocks = #attn.kv_bound<causal>} : !attn.scores<2>
// CHECK-NEXT:    %d = attn.mask %m document(%ids : tensor<?x?xi32>) attributes {blocks = #attn.kv_bound<opaque>} : !attn.scores<2>
