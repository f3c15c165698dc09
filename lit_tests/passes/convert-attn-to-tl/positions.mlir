// A rope at explicit positions reads each row's position from its operand (q's [B, Nq],
// k's [Nk]) and computes cos and sin in the kernel from host-built inverse frequencies
// (no table length bounds arbitrary positions); the backward's inverse rotations read the
// same positions in the dQ and dK/dV epilogues. A pre-rotation kernel that computes cos and sin
// runs 16 warps (4 spilled libdevice's sin and cos; a table-reading one keeps 4, rope.mlir).

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

// CHECK:       tl.kernel @attn_fwd(
// CHECK-SAME:    %qp: !tl.ptr<i64>, %stride_qp: i32, %stride_qp_1: i32
// CHECK-SAME:    %rope_freq: !tl.ptr<f32>
// CHECK:         %pos = tl.load {{.*}} : !tl.tile<!tl.ptr<i64>> -> !tl.tile<i64>
// CHECK:         %q_angle = tl.mul
// CHECK:         %q_cos = tl.cos %q_angle
// CHECK:         tl.for %start_n
// CHECK:           %pos_{{[0-9]+}} = tl.load {{.*}} : !tl.tile<!tl.ptr<i32>> -> !tl.tile<i32>
// CHECK:           %k_cos = tl.cos %k_angle
// CHECK-NOT:     tl.rope_table
// CHECK:         tl.freq_table "rope_freq_0" inv_freq [1.000000e+00 : f32,
// CHECK:         tl.call "attn_fwd"

// BWD:         tl.kernel @attn_bwd_dkdv(
// BWD:           %dk_back_cos = tl.cos
// BWD:         tl.kernel @attn_bwd_dq(
// BWD:           %dq_back_cos = tl.cos

// PY:          rope_freq_0 = _freq_table('rope_freq_0', (1.0,

// PRE:         tl.call "rotate_k" grid ["_cdiv(k.shape[2], 64)", "k.shape[0] * 2"] args [{{.*}}] num_warps 16 num_stages 1
// PRE-NEXT:    tl.call "attn_fwd" {{.*}} num_warps 4
