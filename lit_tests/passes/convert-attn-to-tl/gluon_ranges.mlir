// The Gluon kernel's KV range hook (`gluon_kv_range(q_lo, q_hi, NK)`, which the launcher hands
// the sm90 kernel) computes, line for line, the bounds the generic kernel of the same module
// derives for its KV loop (kv_segments, from causal-split's #attn.kv_bound), for the Q tile of
// query positions [q_lo, q_hi]: the keys some query keeps, [kv_lo, kv_hi) (kv_lo rounded down
// to a KV block), and the whole blocks every query keeps, [full_lo, full_hi), which run
// without mask code. Only the block may differ: the Gluon kernel's is 128, the generic
// kernel's is tiling's BLOCK_N. python_tests/test_gluon_kv_range.py evaluates the hook
// against the masks themselves.

// RUN: attnfuse-opt %s --split-input-file -p 'attnfuse-pipeline{sm=90 seq-len=8192}' | filecheck %s

// A sliding window of 1000 keys: 0 <= q - kv < 1000.
// Some query keeps kv in [q_lo - 999, q_hi + 1), every query keeps kv in [q_hi - 999, q_lo + 1),
// both clamped to [0, NK).
// CHECK-LABEL: tl.kernel @attn_fwd(
// CHECK:         %q_hi = tl.minimum
// CHECK-NEXT:    %[[W1:[0-9]+]] = tl.constant 999 : i32
// CHECK-NEXT:    %[[VLO:[0-9]+]] = tl.sub %q_lo, %[[W1]] : i32, i32 -> i32
// CHECK-NEXT:    %[[ONE:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[VHI:[0-9]+]] = tl.add %q_hi, %[[ONE]] : i32, i32 -> i32
// CHECK-NEXT:    %[[W2:[0-9]+]] = tl.constant 999 : i32
// CHECK-NEXT:    %[[FLO:[0-9]+]] = tl.sub %q_hi, %[[W2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[ONE2:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[FHI:[0-9]+]] = tl.add %q_lo, %[[ONE2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[VLO0:[0-9]+]] = tl.maximum %[[Z]], %[[VLO]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z2:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[FLO0:[0-9]+]] = tl.maximum %[[Z2]], %[[FLO]] : i32, i32 -> i32
// CHECK-NEXT:    %[[VHIN:[0-9]+]] = tl.minimum %NK, %[[VHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FHIN:[0-9]+]] = tl.minimum %NK, %[[FHI]] : i32, i32 -> i32
// kv_lo: the first key's block; kv_hi: one past the last key.
// CHECK-NEXT:    %[[B1:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[VB:[0-9]+]] = tl.floordiv %[[VLO0]], %[[B1]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B2:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %kv_lo = tl.mul %[[VB]], %[[B2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z3:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %kv_hi = tl.maximum %[[VHIN]], %[[Z3]] : i32, i32 -> i32
// full_lo: the every-kept keys' first whole block, within [kv_lo, kv_hi].
// CHECK-NEXT:    %[[B3:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FB:[0-9]+]] = tl.cdiv %[[FLO0]], %[[B3]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B4:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FL:[0-9]+]] = tl.mul %[[FB]], %[[B4]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FL2:[0-9]+]] = tl.maximum %[[FL]], %kv_lo : i32, i32 -> i32
// CHECK-NEXT:    %full_lo = tl.minimum %[[FL2]], %kv_hi : i32, i32 -> i32
// full_hi: the end of their last whole block, within [full_lo, kv_hi].
// CHECK-NEXT:    %[[Z4:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[FHI0:[0-9]+]] = tl.maximum %[[FHIN]], %[[Z4]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B5:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[HB:[0-9]+]] = tl.floordiv %[[FHI0]], %[[B5]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B6:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FH:[0-9]+]] = tl.mul %[[HB]], %[[B6]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FH2:[0-9]+]] = tl.minimum %[[FH]], %kv_hi : i32, i32 -> i32
// CHECK-NEXT:    %full_hi = tl.maximum %[[FH2]], %full_lo : i32, i32 -> i32
// The generic kernel's three loops: masked, full, masked.
// CHECK-NEXT:    tl.for %start_n = %kv_lo to %full_lo step %BLOCK_N
// CHECK:         tl.for %start_n_1 = %full_lo to %full_hi step %BLOCK_N
// CHECK:         tl.for %start_n_2 = %full_hi to %kv_hi step %BLOCK_N

// The Gluon hook: the same lines, then the four bounds.
// CHECK-LABEL: tl.device_fn @gluon_kv_range(%q_lo: i32, %q_hi: i32, %NK: i32)
// CHECK-NEXT:    %[[W1:[0-9]+]] = tl.constant 999 : i32
// CHECK-NEXT:    %[[VLO:[0-9]+]] = tl.sub %q_lo, %[[W1]] : i32, i32 -> i32
// CHECK-NEXT:    %[[ONE:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[VHI:[0-9]+]] = tl.add %q_hi, %[[ONE]] : i32, i32 -> i32
// CHECK-NEXT:    %[[W2:[0-9]+]] = tl.constant 999 : i32
// CHECK-NEXT:    %[[FLO:[0-9]+]] = tl.sub %q_hi, %[[W2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[ONE2:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[FHI:[0-9]+]] = tl.add %q_lo, %[[ONE2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[VLO0:[0-9]+]] = tl.maximum %[[Z]], %[[VLO]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z2:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[FLO0:[0-9]+]] = tl.maximum %[[Z2]], %[[FLO]] : i32, i32 -> i32
// CHECK-NEXT:    %[[VHIN:[0-9]+]] = tl.minimum %NK, %[[VHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FHIN:[0-9]+]] = tl.minimum %NK, %[[FHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B1:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[VB:[0-9]+]] = tl.floordiv %[[VLO0]], %[[B1]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B2:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %kv_lo = tl.mul %[[VB]], %[[B2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z3:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %kv_hi = tl.maximum %[[VHIN]], %[[Z3]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B3:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FB:[0-9]+]] = tl.cdiv %[[FLO0]], %[[B3]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B4:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FL:[0-9]+]] = tl.mul %[[FB]], %[[B4]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FL2:[0-9]+]] = tl.maximum %[[FL]], %kv_lo : i32, i32 -> i32
// CHECK-NEXT:    %full_lo = tl.minimum %[[FL2]], %kv_hi : i32, i32 -> i32
// CHECK-NEXT:    %[[Z4:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[FHI0:[0-9]+]] = tl.maximum %[[FHIN]], %[[Z4]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B5:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[HB:[0-9]+]] = tl.floordiv %[[FHI0]], %[[B5]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B6:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FH:[0-9]+]] = tl.mul %[[HB]], %[[B6]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FH2:[0-9]+]] = tl.minimum %[[FH]], %kv_hi : i32, i32 -> i32
// CHECK-NEXT:    %full_hi = tl.maximum %[[FH2]], %full_lo : i32, i32 -> i32
// CHECK-NEXT:    tl.return %kv_lo, %full_lo, %full_hi, %kv_hi : i32, i32, i32, i32
// CHECK:         tl.gluon_attention "q", "k", "v" -> "out", "lse" scale {{.*}} range @gluon_kv_range masked @gluon_score_masked
func.func @window(%q: tensor<?x4x?x128xbf16>, %k: tensor<?x4x?x128xbf16>, %v: tensor<?x4x?x128xbf16>) -> tensor<?x4x?x128xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xbf16>, tensor<?x4x?x128xbf16> -> !attn.scores<4>
  %m = attn.mask %s sliding_window(1000) : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xbf16> -> tensor<?x4x?x128xbf16>
  func.return %o : tensor<?x4x?x128xbf16>
}

// -----

// Causal (with a softcap, so that the Gluon kernel takes hooks rather than its own causal
// mask): kv <= q. Some query keeps kv in [0, q_hi + 1), every query kv in [0, q_lo + 1);
// kv_lo and full_lo are the constant 0 (the first loop, masked blocks before the full ones,
// is empty and omitted). The generic kernel's block here is tiling's BLOCK_N (64), not 128.
// CHECK-LABEL: tl.kernel @attn_fwd(
// CHECK:         %q_hi = tl.minimum
// CHECK-NEXT:    %[[ONE:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[VHI:[0-9]+]] = tl.add %q_hi, %[[ONE]] : i32, i32 -> i32
// CHECK-NEXT:    %[[ONE2:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[FHI:[0-9]+]] = tl.add %q_lo, %[[ONE2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[VHIN:[0-9]+]] = tl.minimum %NK, %[[VHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FHIN:[0-9]+]] = tl.minimum %NK, %[[FHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[LO:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[Z:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %kv_hi = tl.maximum %[[VHIN]], %[[Z]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z2:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[FHI0:[0-9]+]] = tl.maximum %[[FHIN]], %[[Z2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B1:[0-9]+]] = tl.constant [[BN:[0-9]+]] : i32
// CHECK-NEXT:    %[[HB:[0-9]+]] = tl.floordiv %[[FHI0]], %[[B1]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B2:[0-9]+]] = tl.constant [[BN]] : i32
// CHECK-NEXT:    %[[FH:[0-9]+]] = tl.mul %[[HB]], %[[B2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FH2:[0-9]+]] = tl.minimum %[[FH]], %kv_hi : i32, i32 -> i32
// CHECK-NEXT:    %full_hi = tl.maximum %[[FH2]], %[[LO]] : i32, i32 -> i32
// CHECK-NEXT:    tl.for %start_n = %[[LO]] to %full_hi step %BLOCK_N
// CHECK:         tl.for %start_n_1 = %full_hi to %kv_hi step %BLOCK_N

// CHECK-LABEL: tl.device_fn @gluon_kv_range(%q_lo: i32, %q_hi: i32, %NK: i32)
// CHECK-NEXT:    %[[ONE:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[VHI:[0-9]+]] = tl.add %q_hi, %[[ONE]] : i32, i32 -> i32
// CHECK-NEXT:    %[[ONE2:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[FHI:[0-9]+]] = tl.add %q_lo, %[[ONE2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[VHIN:[0-9]+]] = tl.minimum %NK, %[[VHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FHIN:[0-9]+]] = tl.minimum %NK, %[[FHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[LO:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[Z:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %kv_hi = tl.maximum %[[VHIN]], %[[Z]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z2:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[FHI0:[0-9]+]] = tl.maximum %[[FHIN]], %[[Z2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B1:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[HB:[0-9]+]] = tl.floordiv %[[FHI0]], %[[B1]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B2:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FH:[0-9]+]] = tl.mul %[[HB]], %[[B2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FH2:[0-9]+]] = tl.minimum %[[FH]], %kv_hi : i32, i32 -> i32
// CHECK-NEXT:    %full_hi = tl.maximum %[[FH2]], %[[LO]] : i32, i32 -> i32
// CHECK-NEXT:    tl.return %[[LO]], %[[LO]], %full_hi, %kv_hi : i32, i32, i32, i32
// CHECK:         tl.gluon_attention "q", "k", "v" -> "out", "lse" scale {{.*}} range @gluon_kv_range score @gluon_score masked @gluon_score_masked natural
func.func @causal(%q: tensor<?x4x?x128xbf16>, %k: tensor<?x4x?x128xbf16>, %v: tensor<?x4x?x128xbf16>) -> tensor<?x4x?x128xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xbf16>, tensor<?x4x?x128xbf16> -> !attn.scores<4>
  %c = attn.softcap %s cap = 50.0 : !attn.scores<4>
  %m = attn.mask %c causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xbf16> -> tensor<?x4x?x128xbf16>
  func.return %o : tensor<?x4x?x128xbf16>
}

// -----

// Prefix-LM with a prefix of 700 keys: kv < 700 or kv <= q. Some query keeps kv in
// [0, max(q_hi + 1, 700)), every query kv in [0, max(q_lo + 1, 700)).
// CHECK-LABEL: tl.kernel @attn_fwd(
// CHECK:         %q_hi = tl.minimum
// CHECK-NEXT:    %[[ONE:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[QH1:[0-9]+]] = tl.add %q_hi, %[[ONE]] : i32, i32 -> i32
// CHECK-NEXT:    %[[N:[0-9]+]] = tl.constant 700 : i32
// CHECK-NEXT:    %[[VHI:[0-9]+]] = tl.maximum %[[QH1]], %[[N]] : i32, i32 -> i32
// CHECK-NEXT:    %[[ONE2:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[QL1:[0-9]+]] = tl.add %q_lo, %[[ONE2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[N2:[0-9]+]] = tl.constant 700 : i32
// CHECK-NEXT:    %[[FHI:[0-9]+]] = tl.maximum %[[QL1]], %[[N2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[VHIN:[0-9]+]] = tl.minimum %NK, %[[VHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FHIN:[0-9]+]] = tl.minimum %NK, %[[FHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[LO:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[Z:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %kv_hi = tl.maximum %[[VHIN]], %[[Z]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z2:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[FHI0:[0-9]+]] = tl.maximum %[[FHIN]], %[[Z2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B1:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[HB:[0-9]+]] = tl.floordiv %[[FHI0]], %[[B1]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B2:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FH:[0-9]+]] = tl.mul %[[HB]], %[[B2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FH2:[0-9]+]] = tl.minimum %[[FH]], %kv_hi : i32, i32 -> i32
// CHECK-NEXT:    %full_hi = tl.maximum %[[FH2]], %[[LO]] : i32, i32 -> i32
// CHECK-NEXT:    tl.for %start_n = %[[LO]] to %full_hi step %BLOCK_N
// CHECK:         tl.for %start_n_1 = %full_hi to %kv_hi step %BLOCK_N

// CHECK-LABEL: tl.device_fn @gluon_kv_range(%q_lo: i32, %q_hi: i32, %NK: i32)
// CHECK-NEXT:    %[[ONE:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[QH1:[0-9]+]] = tl.add %q_hi, %[[ONE]] : i32, i32 -> i32
// CHECK-NEXT:    %[[N:[0-9]+]] = tl.constant 700 : i32
// CHECK-NEXT:    %[[VHI:[0-9]+]] = tl.maximum %[[QH1]], %[[N]] : i32, i32 -> i32
// CHECK-NEXT:    %[[ONE2:[0-9]+]] = tl.constant 1 : i32
// CHECK-NEXT:    %[[QL1:[0-9]+]] = tl.add %q_lo, %[[ONE2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[N2:[0-9]+]] = tl.constant 700 : i32
// CHECK-NEXT:    %[[FHI:[0-9]+]] = tl.maximum %[[QL1]], %[[N2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[VHIN:[0-9]+]] = tl.minimum %NK, %[[VHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FHIN:[0-9]+]] = tl.minimum %NK, %[[FHI]] : i32, i32 -> i32
// CHECK-NEXT:    %[[LO:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[Z:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %kv_hi = tl.maximum %[[VHIN]], %[[Z]] : i32, i32 -> i32
// CHECK-NEXT:    %[[Z2:[0-9]+]] = tl.constant 0 : i32
// CHECK-NEXT:    %[[FHI0:[0-9]+]] = tl.maximum %[[FHIN]], %[[Z2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B1:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[HB:[0-9]+]] = tl.floordiv %[[FHI0]], %[[B1]] : i32, i32 -> i32
// CHECK-NEXT:    %[[B2:[0-9]+]] = tl.constant 128 : i32
// CHECK-NEXT:    %[[FH:[0-9]+]] = tl.mul %[[HB]], %[[B2]] : i32, i32 -> i32
// CHECK-NEXT:    %[[FH2:[0-9]+]] = tl.minimum %[[FH]], %kv_hi : i32, i32 -> i32
// CHECK-NEXT:    %full_hi = tl.maximum %[[FH2]], %[[LO]] : i32, i32 -> i32
// CHECK-NEXT:    tl.return %[[LO]], %[[LO]], %full_hi, %kv_hi : i32, i32, i32, i32
// CHECK:         tl.gluon_attention "q", "k", "v" -> "out", "lse" scale {{.*}} range @gluon_kv_range masked @gluon_score_masked
func.func @prefix(%q: tensor<?x4x?x128xbf16>, %k: tensor<?x4x?x128xbf16>, %v: tensor<?x4x?x128xbf16>) -> tensor<?x4x?x128xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xbf16>, tensor<?x4x?x128xbf16> -> !attn.scores<4>
  %m = attn.mask %s prefix_lm(700) : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xbf16> -> tensor<?x4x?x128xbf16>
  func.return %o : tensor<?x4x?x128xbf16>
}
