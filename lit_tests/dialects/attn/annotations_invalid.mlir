// RUN: ATTN_VERIFY
// RUN: echo 'builtin.module attributes {p = #attn.placement<kv-loop>} {}' | not attnfuse-opt 2>&1 | filecheck %s --check-prefix=ENUM
// ENUM: Expected `q_prologue`, `kv_loop`, `prerotate`, or `cache`.

// Misspelt or mistyped pass annotations, one per chunk: each is a parse or verifier error.

func.func @placement_as_string(%q: tensor<?x4x?x64xf16>) {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 64 {placement = "kv_loop"} : tensor<?x4x?x64xf16>
  func.return
}
// CHECK: attn.rope annotation 'placement' must be an #attn.placement<q_prologue|kv_loop|prerotate|cache>, got "kv_loop"

// -----

func.func @placement_on_scale(%k: tensor<?x4x?x64xf16>) {
  %ks = attn.scale %k value = 2.0 {placement = 1 : i32} : tensor<?x4x?x64xf16>
  func.return
}
// CHECK: attn.scale annotation 'placement' must be an #attn.placement<q_prologue|kv_loop|prerotate|cache>, got 1 : i32

// -----

func.func @score_scale_as_string(%q: tensor<?x4x?x64xf16>) {
  %s = attn.qk %q, %q {score_scale = "0.125"} : tensor<?x4x?x64xf16>, tensor<?x4x?x64xf16> -> !attn.scores<4>
  func.return
}
// CHECK: attn.qk annotation 'score_scale' must be a float, got "0.125"

// -----

func.func @log2e_folded_not_unit(%q: tensor<?x4x?x64xf16>) {
  %s = attn.qk %q, %q {score_scale = 0.18 : f64, log2e_folded = true} : tensor<?x4x?x64xf16>, tensor<?x4x?x64xf16> -> !attn.scores<4>
  func.return
}
// CHECK: attn.qk annotation 'log2e_folded' must be a unit attribute, got true

// -----

func.func @blocks_as_string(%s: !attn.scores<4>) {
  %m = attn.mask %s sliding_window(128) attributes {blocks = "sliding_window(128)"} : !attn.scores<4>
  func.return
}
// CHECK: attn.mask annotation 'blocks' must be an #attn.kv_bound<...>, got "sliding_window(128)"

// -----

func.func @kv_bound_unknown_kind(%s: !attn.scores<4>) {
  %m = attn.mask %s causal attributes {blocks = #attn.kv_bound<casual>} : !attn.scores<4>
  func.return
}
// CHECK: #attn.kv_bound kind must be one of causal, sliding_window, prefix_lm, opaque, got 'casual'

// -----

// document ids do not bound the KV range.
func.func @kv_bound_unbounded_kind(%s: !attn.scores<4>) {
  %m = attn.mask %s causal attributes {blocks = #attn.kv_bound<document>} : !attn.scores<4>
  func.return
}
// CHECK: #attn.kv_bound kind must be one of causal, sliding_window, prefix_lm, opaque, got 'document'

// -----

func.func @kv_bound_without_parameter(%s: !attn.scores<4>) {
  %m = attn.mask %s sliding_window(128) attributes {blocks = #attn.kv_bound<sliding_window>} : !attn.scores<4>
  func.return
}
// CHECK: #attn.kv_bound<sliding_window> needs an integer parameter

// -----

func.func @kv_bound_with_parameter(%s: !attn.scores<4>) {
  %m = attn.mask %s causal attributes {blocks = #attn.kv_bound<opaque(3)>} : !attn.scores<4>
  func.return
}
// CHECK: #attn.kv_bound<opaque> takes no parameter
