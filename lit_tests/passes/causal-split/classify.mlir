// RUN: attnfuse-opt %s --split-input-file -p causal-split | filecheck %s

// causal-split names the bounded shape of every mask (`blocks`) and lists them on the
// function (`attn.kv_blocks`): their conjunction tells the kernel which KV blocks it
// skips, which need no mask code and which are masked. Anything it cannot bound is
// `opaque` (every visited block masked). Nothing but attributes changes.

func.func @causal(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s causal : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @causal(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<causal>]}
// CHECK-NEXT:    %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
// CHECK-NEXT:    %m = attn.mask %s causal attributes {blocks = #attn.kv_bound<causal>} : !attn.scores<2>
// CHECK-NEXT:    %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
// CHECK-NEXT:    %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>

// -----

func.func @sliding_window(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s sliding_window(128) : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @sliding_window(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<sliding_window(128)>]}
// CHECK:         %m = attn.mask %s sliding_window(128) attributes {blocks = #attn.kv_bound<sliding_window(128)>} : !attn.scores<2>

// -----

func.func @prefix_lm(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s prefix_lm(64) : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @prefix_lm(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<prefix_lm(64)>]}
// CHECK:         %m = attn.mask %s prefix_lm(64) attributes {blocks = #attn.kv_bound<prefix_lm(64)>} : !attn.scores<2>

// -----

// Document ids live in a tensor: nothing is known about them at compile time.
func.func @document(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>, %ids: tensor<?x?xi32>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s document(%ids : tensor<?x?xi32>) : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @document(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<opaque>]}
// CHECK:         %m = attn.mask %s document(%ids : tensor<?x?xi32>) attributes {blocks = #attn.kv_bound<opaque>} : !attn.scores<2>

// -----

// No mask: an empty list, so every block is full (the tail block still checks bounds).
func.func @unmasked(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %c = attn.softcap %s cap = 30.0 : !attn.scores<2>
  %p = attn.softmax %c : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @unmasked(
// CHECK-SAME:    attributes {attn.kv_blocks = []}
// CHECK-NEXT:    %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
// CHECK-NEXT:    %c = attn.softcap %s cap = 30.0 : !attn.scores<2>
