// A backward function kernel-path gave the sm90 Gluon backward: the launcher chooses per call
// between the Gluon kernels (by default dK/dV adding dQ's shares up by TMA reduce-adds, REDUCE;
// with gluon-dq-reduce=false dK/dV, then the ordered dQ; on the pre-rotated q and k) with the
// kernels that finish dQ and dK from their fp32 workspaces, and the generic dK/dV and dQ
// kernels. The variant's P and dS reach the Gluon kernels as device functions.

// RUN: attnfuse-opt %s --split-input-file -p 'attnfuse-pipeline{sm=90 seq-len=4096 backward=true gluon-dq-reduce=false}' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'attnfuse-pipeline{sm=90 seq-len=4096 backward=true}' | filecheck %s --check-prefix=REDUCE
// RUN: attnfuse-opt %s --split-input-file -p 'attnfuse-pipeline{sm=90 seq-len=4096 backward=true gluon=false}' | filecheck %s --check-prefix=OFF

// Qwen3 (QK-norm with learned weights, RoPE, causal, GQA): Q's and K's chains' derivatives run
// in attn_bwd_dq_acc and attn_bwd_dk_acc, which also write the weights' gradient shares in the
// generic kernels' numbering (one buffer per weight whichever path ran).
// CHECK:       tl.kernel @attn_bwd_dkdv(
// CHECK:       tl.kernel @attn_bwd_dq(
// CHECK:       tl.kernel @attn_bwd_dq_acc(%DQ_ACC: !tl.ptr<f32>
// CHECK:       tl.kernel @attn_bwd_dk_acc(%DK_ACC: !tl.ptr<f32>
// CHECK:       tl.device_fn @gluon_bwd_range(%k_lo: i32, %k_hi: i32, %NQ: i32)
// CHECK:       tl.device_fn @gluon_bwd_kv_range(%q_lo: i32, %q_hi: i32, %NK: i32)
// CHECK:       tl.device_fn @gluon_bwd_full(%s: !tl.tile<f32>, %dp: !tl.tile<f32>, %lse2: !tl.tile<f32>, %delta: !tl.tile<f32>, %q_idx: !tl.tile<i32>, %kv_idx: !tl.tile<i32>, %off_hz: i32)
// CHECK-NOT:   tl.where
// CHECK:       tl.return
// CHECK:       tl.device_fn @gluon_bwd_masked(
// CHECK:       %causal = tl.cmp "<=" %kv_idx, %q_idx
// CHECK:       tl.return
// CHECK:       tl.launcher "launch"(["q", "k", "v", "wq", "wk", "out_5", "lse_6", "dout_7"]) {
// CHECK:         tl.alloc "grad_4_part" shape ["(_cdiv(k.shape[2], 128)) * (k.shape[0] * 2)", "128"]
// CHECK:         tl.alloc "grad_3_part" shape ["(q.shape[0] * 8) * (_cdiv(q.shape[2], 128))", "128"]
// CHECK:         tl.call "rotate_k"
// CHECK-NEXT:    tl.host_if "_gluon_bwd_fits(q_rot, k_rot, v, dout_7, lse_6, 2048)" {
// CHECK-NEXT:      tl.alloc "dq_acc" shape ["q.shape[0]", "8", "q.shape[2]", "128"] dtype "torch.float32"
// CHECK-NEXT:      tl.alloc "dk_acc" shape ["k.shape[0]", "2", "k.shape[2]", "128"] dtype "torch.float32"
// CHECK-NEXT:      tl.gluon_backward "q_rot", "k_rot", "v", "dout_7", "lse_6", "delta" -> "dq_acc", "dk_acc", "dv" scale 0.088388347648318433 range @gluon_bwd_range kv_range @gluon_bwd_kv_range full @gluon_bwd_full masked @gluon_bwd_masked
// CHECK-NEXT:      tl.call "attn_bwd_dq_acc" grid ["q.shape[0] * 8", "_cdiv(q.shape[2], 128)"]
// CHECK-NEXT:      tl.call "attn_bwd_dk_acc" grid ["_cdiv(k.shape[2], 128)", "k.shape[0] * 2"]
// CHECK-NEXT:    } else {
// CHECK-NEXT:      tl.call "attn_bwd_dkdv"
// CHECK-NEXT:      tl.call "attn_bwd_dq"
// CHECK-NEXT:    }
// CHECK-NEXT:    tl.host_sum "grad_3" = "grad_3_part"
// CHECK-NEXT:    tl.host_sum "grad_4" = "grad_4_part"
// OFF-NOT:     gluon
func.func @qwen(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>, %wq: tensor<128xf32>, %wk: tensor<128xf32>) -> tensor<?x8x?x128xbf16> {
  %qn = attn.norm %q eps = 1.0e-06 weight(%wq : tensor<128xf32>) : tensor<?x8x?x128xbf16>
  %qr = attn.rope %qn half theta = 1000000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %kn = attn.norm %k eps = 1.0e-06 weight(%wk : tensor<128xf32>) : tensor<?x2x?x128xbf16>
  %kr = attn.rope %kn half theta = 1000000.0 rotary_dim = 128 : tensor<?x2x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// -----

// No Q or K transforms, ALiBi (an extra tensor the functions read) and a sink (its gradient
// from attn_bwd_pre): the Gluon kernel writes dK itself; with dq-reduce (the default) its dK/dV
// kernel adds dQ's shares into the workspace, unless PyTorch asks for deterministic algorithms.
// CHECK:       tl.device_fn @gluon_bwd_full(%s: !tl.tile<f32>, {{.*}}, %off_hz: i32, %sl: !tl.ptr<f32>, %stride_sl: i32)
// CHECK:       tl.host_if "_gluon_bwd_fits(q, k, v, dout_7, lse_6, 2048)" {
// CHECK-NEXT:      tl.alloc "dq_acc"
// CHECK-NEXT:      tl.gluon_backward "q", "k", "v", "dout_7", "lse_6", "delta" -> "dq_acc", "dk", "dv" scale 1.250000e-01 range @gluon_bwd_range kv_range @gluon_bwd_kv_range full @gluon_bwd_full masked @gluon_bwd_masked args ["sl", "sl.stride(0)"]
// CHECK-NEXT:      tl.call "attn_bwd_dq_acc"
// CHECK-NEXT:    } else {
// REDUCE:      tl.gluon_backward "q_rot", {{.*}} masked @gluon_bwd_masked reduce_dq "not _gl_deterministic()"
// REDUCE:      tl.gluon_backward "q", {{.*}} masked @gluon_bwd_masked reduce_dq "not _gl_deterministic()" args ["sl", "sl.stride(0)"]
func.func @alibi(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>, %v: tensor<?x8x?x64xf16>, %sl: tensor<8xf32>, %sk: tensor<8xf32>) -> tensor<?x8x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<8>
  %b = attn.bias %s alibi(%sl : tensor<8xf32>) : !attn.scores<8>
  %m = attn.mask %b causal : !attn.scores<8>
  %p = attn.softmax %m sink(%sk : tensor<8xf32>) : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf16>
  func.return %o : tensor<?x8x?x64xf16>
}

// -----

// Llama 3 at explicit positions (transformers' position_ids): the launcher computes RoPE's cos and
// sin tables per call, before either path, and every kernel reads them (4 warps). K's RoPE is the
// Gluon dK/dV kernel's (`k_rope`: dK stored back through it, no attn_bwd_dk_acc; K pre-rotated at
// head dim 128).
// CHECK:       tl.launcher "launch"(["q", "k", "v", "qp", "kp", "out_5", "lse_6", "dout_7"]) {
// CHECK:         tl.call "rope_at_0_tables" grid ["_cdiv(qp.numel(), 32)"]
// CHECK:         tl.call "rope_at_1_tables" grid ["_cdiv(kp.numel(), 32)"]
// CHECK:         tl.call "rotate_q" {{.*}} num_warps 4 num_stages 1
// CHECK-NEXT:    tl.call "rotate_k" {{.*}} num_warps 4 num_stages 1
// CHECK:           tl.gluon_backward "q_rot", "k_rot", {{.*}} -> "dq_acc", "dk", "dv" {{.*}} k_rope ["rope_at_1_cos", "rope_at_1_sin", "kp.shape[1]"]
// CHECK-NEXT:      tl.call "attn_bwd_dq_acc" {{.*}}"qp.shape[1]", "rope_at_0_cos", "rope_at_0_sin", {{.*}} num_warps 16 num_stages 1
// CHECK-NEXT:    } else {
func.func @llama_positions(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>, %qp: tensor<?x?xi64>, %kp: tensor<?x?xi64>) -> tensor<?x8x?x128xbf16> {
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = 128 positions(%qp : tensor<?x?xi64>) : tensor<?x8x?x128xbf16>
  %kr = attn.rope %k half theta = 500000.0 rotary_dim = 128 positions(%kp : tensor<?x?xi64>) : tensor<?x2x?x128xbf16>
  %s = attn.qk %qr, %kr scale = 0.08838834764831845 : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// -----

// The paper shape (head dim 64) with RoPE: the Gluon dK/dV kernel applies K's RoPE itself
// (`apply_k_rope`: its consumers rotate the keys of k as given, and store them for the ordered dQ
// kernel), so k_rot and rotate_k are the generic kernels' only. At head dim 128 (above) K is
// pre-rotated and the kernel only takes dK back through the RoPE.
// CHECK:       tl.launcher "launch"(["q", "k", "v", "out_3", "lse_4", "dout_5"]) {
// CHECK-NOT:     "k_rot"
// CHECK:         tl.call "rotate_q"
// CHECK-NEXT:    tl.host_if "_gluon_bwd_fits(q_rot, k, v, dout_5, lse_4, 2048)" {
// CHECK:           tl.gluon_backward "q_rot", "k", {{.*}} k_rope ["rope_0_cos", "rope_0_sin", "0"] apply_k_rope
// CHECK:         } else {
// CHECK-NEXT:      tl.alloc "k_rot"
// CHECK-NEXT:      tl.call "rotate_k"
// CHECK-NEXT:      tl.call "attn_bwd_dkdv" {{.*}} args ["q_rot", {{.*}}, "k_rot",
func.func @paper_rope(%q: tensor<?x12x?x64xf16>, %k: tensor<?x12x?x64xf16>, %v: tensor<?x12x?x64xf16>) -> tensor<?x12x?x64xf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x12x?x64xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 64 : tensor<?x12x?x64xf16>
  %s = attn.qk %qr, %kr : tensor<?x12x?x64xf16>, tensor<?x12x?x64xf16> -> !attn.scores<12>
  %m = attn.mask %s causal : !attn.scores<12>
  %p = attn.softmax %m : !attn.scores<12> -> !attn.probs<12>
  %o = attn.pv %p, %v : !attn.probs<12>, tensor<?x12x?x64xf16> -> tensor<?x12x?x64xf16>
  func.return %o : tensor<?x12x?x64xf16>
}
