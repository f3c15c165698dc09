// A function kernel-path gave the sm90 Gluon kernel: the launcher chooses per call between
// it (after Q's and K's transforms in pre-rotation kernels) and the generic kernel.

// RUN: attnfuse-opt %s --split-input-file -p 'attnfuse-pipeline{sm=90 seq-len=4096 gluon-head-dims=64,128}' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'attnfuse-pipeline{sm=90 seq-len=4096 gluon=false}' | filecheck %s --check-prefix=OFF

// RoPE on q and k: K pre-rotated for both kernels; Q's plain RoPE is the Gluon kernel's own
// (from the launcher's cos/sin tables), and the generic kernel's prologue.
// CHECK:       tl.kernel @rotate_k(
// CHECK-NOT:   tl.kernel @rotate_q(
// CHECK:       tl.kernel @attn_fwd(
// CHECK:       tl.launcher "launch"(["q", "k", "v"]) {
// CHECK:         tl.call "rotate_k"
// CHECK-NEXT:    tl.host_if "_gluon_fits(q, k, v, 512)" {
// CHECK-NEXT:      tl.gluon_attention "q", "k_rot", "v" -> "out", "lse" scale 0.088388347648318433 causal rope ["rope_0_cos", "rope_0_sin", "0"]
// CHECK-NEXT:    } else {
// CHECK-NEXT:      tl.call "attn_fwd"
// CHECK-NEXT:    }
// CHECK-NEXT:    tl.host_return ["out", "lse"]
// OFF-NOT:     tl.host_if
// OFF-NOT:     rotate_q
func.func @rope(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>) -> tensor<?x8x?x128xbf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 128 : tensor<?x2x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// -----

// RoPE at explicit positions (transformers' position_ids, [B, N]): the launcher computes the
// cos/sin tables per call, before either kernel; the Gluon kernel rotates Q itself from them,
// reading row b * N + n for row n of sequence b.
// CHECK:       tl.kernel @rope_at_1_tables(
// CHECK-NOT:   tl.kernel @rotate_q(
// CHECK:       tl.kernel @attn_fwd(
// CHECK:       tl.launcher "launch"(["q", "k", "v", "qp", "kp"]) {
// CHECK:         tl.call "rope_at_0_tables" grid ["_cdiv(kp.numel(), 32)"]
// CHECK:         tl.call "rope_at_1_tables" grid ["_cdiv(qp.numel(), 32)"]
// CHECK-NEXT:    tl.call "rotate_k"
// CHECK-NEXT:    tl.host_if "_gluon_fits(q, k, v, 512)" {
// CHECK-NEXT:      tl.gluon_attention "q", "k_rot", "v" -> "out", "lse" scale 0.088388347648318433 causal rope ["rope_at_1_cos", "rope_at_1_sin", "qp.shape[1]"]
func.func @rope_at_positions(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>, %qp: tensor<?x?xi64>, %kp: tensor<?x?xi64>) -> tensor<?x8x?x128xbf16> {
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = 128 positions(%qp : tensor<?x?xi64>) : tensor<?x8x?x128xbf16>
  %kr = attn.rope %k half theta = 500000.0 rotary_dim = 128 positions(%kp : tensor<?x?xi64>) : tensor<?x2x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// -----

// A partial RoPE (half the channels) is not the Gluon kernel's: Q is rotated by rotate_q first.
// CHECK:       tl.kernel @rotate_q(
// CHECK:       tl.host_if "_gluon_fits(q, k, v, 4096)" {
// CHECK-NEXT:    tl.alloc "q_rot" shape ["q.shape[0]", "8", "q.shape[2]", "128"] dtype "torch.bfloat16" device "q.device"
// CHECK-NEXT:    tl.call "rotate_q"
// CHECK-NEXT:    tl.gluon_attention "q_rot", "k_rot", "v" -> "out", "lse" scale 0.088388347648318433 causal
// CHECK-NOT:     rope
// CHECK-NEXT:  } else {
func.func @partial(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>) -> tensor<?x8x?x128xbf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x8x?x128xbf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 64 : tensor<?x2x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// -----

// No transforms: q and k go to the Gluon kernel as they are; the given scale is its scale
// (head dim 64, the forward: min-len-fwd).
// CHECK-NOT:   rotate_
// CHECK:       tl.host_if "_gluon_fits(q, k, v, 512)" {
// CHECK-NEXT:    tl.gluon_attention "q", "k", "v" -> "out", "lse" scale 2.500000e-01
// CHECK-NOT:     causal
// CHECK-NEXT:  } else {
func.func @full(%q: tensor<?x4x?x64xf16>, %k: tensor<?x4x?x64xf16>, %v: tensor<?x4x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.qk %q, %k scale = 0.25 : tensor<?x4x?x64xf16>, tensor<?x4x?x64xf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Score ops beyond a causal mask: the Gluon kernel takes them as device functions. The KV range
// (causal-split's window bounds, in keys), the score ops of unmasked blocks (softcap: on the
// scaled scores, `natural`) and of masked ones (softcap, then the window); a sink by name.
// CHECK:       tl.device_fn @gluon_kv_range(%q_lo: i32, %q_hi: i32, %NK: i32)
// CHECK:         tl.return %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : i32, i32, i32, i32
// CHECK:       tl.device_fn @gluon_score(%s: !tl.tile<f32>, %q_idx: !tl.tile<i32>, %kv_idx: !tl.tile<i32>, %off_hz: i32)
// CHECK-NOT:     tl.where
// CHECK:         tl.fast_tanh
// CHECK-NOT:     tl.where
// CHECK:         tl.return
// CHECK:       tl.device_fn @gluon_score_masked(%s: !tl.tile<f32>, %q_idx: !tl.tile<i32>, %kv_idx: !tl.tile<i32>, %off_hz: i32)
// CHECK:         tl.fast_tanh
// CHECK:         tl.where
// CHECK:         tl.return
// CHECK:       tl.gluon_attention "q", "k", "v" -> "out", "lse" scale 2.500000e-01 sink "sink" range @gluon_kv_range score @gluon_score masked @gluon_score_masked natural
// OFF-NOT:     tl.device_fn
func.func @gemma(%q: tensor<?x4x?x128xbf16>, %k: tensor<?x4x?x128xbf16>, %v: tensor<?x4x?x128xbf16>, %sink: tensor<4xf32>) -> tensor<?x4x?x128xbf16> {
  %s = attn.qk %q, %k scale = 0.25 : tensor<?x4x?x128xbf16>, tensor<?x4x?x128xbf16> -> !attn.scores<4>
  %c = attn.softcap %s cap = 50.0 : !attn.scores<4>
  %m = attn.mask %c sliding_window(1000) : !attn.scores<4>
  %p = attn.softmax %m sink(%sink : tensor<4xf32>) : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xbf16> -> tensor<?x4x?x128xbf16>
  func.return %o : tensor<?x4x?x128xbf16>
}

// -----

// CHECK:       tl.device_fn @gluon_kv_range
// Masks only: no function for unmasked blocks, the masked one sees raw scores (no `natural`);
// the document ids are the score function's extra arguments.
// CHECK:       tl.device_fn @gluon_score_masked(%s: !tl.tile<f32>, %q_idx: !tl.tile<i32>, %kv_idx: !tl.tile<i32>, %off_hz: i32, %ids: !tl.ptr<i32>, %{{.*}}: i32, %{{.*}}: i32)
// CHECK-NOT:   tl.device_fn
// CHECK:       tl.gluon_attention "q", "k", "v" -> "out", "lse" scale 0.08838{{[0-9]+}} range @gluon_kv_range masked @gluon_score_masked args ["ids", "ids.stride(0)", "ids.stride(1)"]
func.func @docs(%q: tensor<?x4x?x128xbf16>, %k: tensor<?x4x?x128xbf16>, %v: tensor<?x4x?x128xbf16>, %ids: tensor<?x?xi32>) -> tensor<?x4x?x128xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xbf16>, tensor<?x4x?x128xbf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %d = attn.mask %m document(%ids : tensor<?x?xi32>) : !attn.scores<4>
  %p = attn.softmax %d : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xbf16> -> tensor<?x4x?x128xbf16>
  func.return %o : tensor<?x4x?x128xbf16>
}
