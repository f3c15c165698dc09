// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP

// The pass annotations as typed attributes: rope-fusion's `placement` (`cache`: applied when
// keys are written to a KV cache, for the decode kernel)
// (#attn.placement), `score_scale` and `log2e_folded`; causal-split's `blocks` and
// `attn.kv_blocks` (#attn.kv_bound: a KV-bounding mask kind and its parameter, or opaque).

func.func @annotated(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %ids: tensor<?x?xi32>) attributes {attn.kv_blocks = [#attn.kv_bound<causal>, #attn.kv_bound<sliding_window(128)>, #attn.kv_bound<prefix_lm(0)>, #attn.kv_bound<opaque>]} {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 64 {placement = #attn.placement<q_prologue>} : tensor<?x4x?x64xf16>
  %kn = attn.norm %k eps = 1.0e-06 {placement = #attn.placement<kv_loop>} : tensor<?x2x?x64xf16>
  %ks = attn.scale %kn value = 2.0 {placement = #attn.placement<prerotate>} : tensor<?x2x?x64xf16>
  %kc = attn.scale %ks value = 1.0 {placement = #attn.placement<cache>} : tensor<?x2x?x64xf16>
  %s = attn.qk %qr, %kc {score_scale = 0.18033688011112042 : f64, log2e_folded} : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
  %c = attn.mask %s causal attributes {blocks = #attn.kv_bound<causal>} : !attn.scores<4>
  %w = attn.mask %c sliding_window(128) attributes {blocks = #attn.kv_bound<sliding_window(128)>} : !attn.scores<4>
  %p = attn.mask %w prefix_lm(0) attributes {blocks = #attn.kv_bound<prefix_lm(0)>} : !attn.scores<4>
  %d = attn.mask %p document(%ids : tensor<?x?xi32>) attributes {blocks = #attn.kv_bound<opaque>} : !attn.scores<4>
  func.return
}

// CHECK-LABEL: func.func @annotated(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<causal>, #attn.kv_bound<sliding_window(128)>, #attn.kv_bound<prefix_lm(0)>, #attn.kv_bound<opaque>]}
// CHECK-NEXT:    %qr = attn.rope %q half theta = 10000.0 rotary_dim = 64 {placement = #attn.placement<q_prologue>} : tensor<?x4x?x64xf16>
// CHECK-NEXT:    %kn = attn.norm %k eps = 1.0e-06 {placement = #attn.placement<kv_loop>} : tensor<?x2x?x64xf16>
// CHECK-NEXT:    %ks = attn.scale %kn value = 2.0 {placement = #attn.placement<prerotate>} : tensor<?x2x?x64xf16>
// CHECK-NEXT:    %kc = attn.scale %ks value = 1.0 {placement = #attn.placement<cache>} : tensor<?x2x?x64xf16>
// CHECK-NEXT:    %s = attn.qk %qr, %kc {score_scale = 0.18033688011112042 : f64, log2e_folded} : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
// CHECK-NEXT:    %c = attn.mask %s causal attributes {blocks = #attn.kv_bound<causal>} : !attn.scores<4>
// CHECK-NEXT:    %w = attn.mask %c sliding_window(128) attributes {blocks = #attn.kv_bound<sliding_window(128)>} : !attn.scores<4>
// CHECK-NEXT:    %p = attn.mask %w prefix_lm(0) attributes {blocks = #attn.kv_bound<prefix_lm(0)>} : !attn.scores<4>
// CHECK-NEXT:    %d = attn.mask %p document(%ids : tensor<?x?xi32>) attributes {blocks = #attn.kv_bound<opaque>} : !attn.scores<4>
