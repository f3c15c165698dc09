// A rope at explicit positions reads its cos and sin from tables the launcher computes per call
// (one small kernel per positions tensor: a row per token, q's [B, Nq] flattened, k's [Nk]), so
// no attention kernel computes a sine: the kernels read each row's token index (b * N + row for
// [B, N] positions) into them; the backward's inverse rotations read the same tables in the dQ and
// dK/dV epilogues, and the pre-rotation kernels keep 4 warps.

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 rope-mode=fused}' | filecheck %s
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 backward=true}' | filecheck %s --check-prefix=BWD
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 rope-mode=fused}' -t triton | filecheck %s --check-prefix=PY
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 rope-mode=prerotate}' | filecheck %s --check-prefix=PRE

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>, %qp: tensor<?x?xi64>, %kp: tensor<?xi32>) -> tensor<?x4x?x32xf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 32 positions(%qp : tensor<?x?xi64>) : tensor<?x4x?x32xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 32 positions(%kp : tensor<?xi32>) : tensor<?x2x?x32xf16>
  %s = attn.qk %qr, %kr : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// CHECK:       tl.kernel @rope_at_0_tables(%rope_at_0_cos: !tl.ptr<f32>, %rope_at_0_sin: !tl.ptr<f32>, %ROWS: i32, %BLOCK: i32 constexpr, %qp: !tl.ptr<i64>, %stride_qp: i32, %stride_qp_1: i32, %qp_n: i32, %rope_freq: !tl.ptr<f32>)
// CHECK:         %pos = tl.load {{.*}} : !tl.tile<!tl.ptr<i64>> -> !tl.tile<i64>
// CHECK:         %angle = tl.mul
// CHECK:         %cos = tl.cos %angle
// CHECK:         %sin = tl.sin %angle
// CHECK:       tl.kernel @rope_at_1_tables({{.*}}%kp: !tl.ptr<i32>, %stride_kp: i32, %rope_freq: !tl.ptr<f32>)
// CHECK:       tl.kernel @attn_fwd(
// CHECK-SAME:    %qp_n: i32, %rope_at_0_cos: !tl.ptr<f32>, %rope_at_0_sin: !tl.ptr<f32>, %rope_at_1_cos: !tl.ptr<f32>, %rope_at_1_sin: !tl.ptr<f32>)
// CHECK-NOT:     tl.cos
// CHECK:         %pos_tok = tl.add %{{[0-9]+}}, %offs_m
// CHECK:         %q_cos = tl.load
// CHECK:         tl.for %start_n
// CHECK-NOT:       tl.cos
// CHECK:           %k_cos = tl.load
// CHECK-NOT:     tl.rope_table
// CHECK:         tl.freq_table "rope_freq_0" inv_freq [1.000000e+00 : f32,
// CHECK-NEXT:    tl.alloc "rope_at_0_cos" shape ["qp.numel()", "16"] dtype "torch.float32"
// CHECK-NEXT:    tl.alloc "rope_at_0_sin" shape ["qp.numel()", "16"] dtype "torch.float32"
// CHECK-NEXT:    tl.call "rope_at_0_tables" grid ["_cdiv(qp.numel(), 32)"] args ["rope_at_0_cos", "rope_at_0_sin", "qp.numel()", "32", "qp", "qp.stride(0)", "qp.stride(1)", "qp.shape[1]", "rope_freq_0"]
// CHECK:         tl.call "rope_at_1_tables" grid ["_cdiv(kp.numel(), 32)"]
// CHECK-NEXT:    tl.call "attn_fwd"

// BWD:         tl.kernel @attn_bwd_dkdv(
// BWD-NOT:       tl.cos
// BWD:           %dk_back_cos = tl.load
// BWD:         tl.kernel @attn_bwd_dq(
// BWD:           %pos_tok = tl.add
// BWD:           %dq_back_cos = tl.load
// BWD:         tl.call "rope_at_0_tables"
// BWD:         tl.call "rope_at_1_tables"

// PY:          rope_freq_0 = _freq_table('rope_freq_0', (1.0,
// PY-NEXT:     rope_at_0_cos = torch.empty((qp.numel(), 16,), dtype=torch.float32, device=q_device)

// PRE:         tl.call "rotate_k" grid ["_cdiv(k.shape[2], 32)", "k.shape[0] * 2"] args [{{.*}}] num_warps 4 num_stages 1
// PRE-NEXT:    tl.call "attn_fwd" {{.*}} num_warps 4
