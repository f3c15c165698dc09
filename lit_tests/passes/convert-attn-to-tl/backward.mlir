// A backward function lowers to FlashAttention-2's backward: delta, the pre-rotations, a
// dK/dV kernel looping over the Q blocks of each query head of its group (masked, full and
// masked segments for causal), and a dQ kernel looping over KV blocks (full, then masked).
// RoPE's derivative (the inverse rotation, with a gather of each channel's partner) runs
// in the epilogues. The launcher returns the gradients in attn.wrt's order.

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 backward=true}' | filecheck %s
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 backward=true wrt=2}' | filecheck %s --check-prefix=DV

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>) -> tensor<?x4x?x32xf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 32 : tensor<?x4x?x32xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 32 : tensor<?x2x?x32xf16>
  %s = attn.qk %qr, %kr : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// CHECK:       tl.kernel @attn_bwd_pre(
// CHECK:         %delta = tl.reduce sum {{.*}} axis 1
// CHECK:       tl.kernel @rotate_q(
// CHECK:       tl.kernel @rotate_k(
// CHECK:       tl.kernel @attn_bwd_dkdv(
// CHECK-NOT:     k_scaled
// CHECK:         tl.for %hg = {{.*}} iter_args(%dk_2 = %dk, %dv_2 = %dv)
// CHECK:           tl.for %start_m = %q_lo to %full_q_lo step %BLOCK_N
// The scores' scale on the fp32 product, as the forward's: with only a mask, in exp2's argument.
// CHECK:             %kq = tl.dot %k{{(_[0-9]+)?}}, %{{.*}} : !tl.tile<f16>, !tl.tile<f16> -> !tl.tile<f32>
// CHECK:             %causal = tl.cmp "<="
// CHECK:             %[[C:.*]] = tl.constant 0.255034864 : f32
// CHECK-NEXT:        %s2 = tl.mul %s_masked, %[[C]]
// CHECK:             %p = tl.exp2
// A partial block: P is exactly 0 where the mask dropped the score (not exp2(-inf - NaN)).
// CHECK:             %dropped = tl.cmp "==" %s_masked,
// CHECK-NEXT:        %{{.*}} = tl.constant 0.0
// CHECK-NEXT:        %p_kept = tl.where %dropped,
// CHECK:             %dv_5 = tl.dot {{.*}}, %do acc %dv_4
// CHECK:             %dp = tl.dot %v_1,
// CHECK:             %ds = tl.mul %p_kept,
// CHECK:             %ds_kept = tl.where %dropped,
// CHECK:             %dk_5 = tl.dot {{.*}}, %q acc %dk_4
// CHECK:           tl.for %start_m_1 = %full_q_lo to %full_q_hi step %BLOCK_N
// CHECK-NOT:         %causal
// CHECK:           tl.for %start_m_2 = %full_q_hi to %NQ step %BLOCK_N
// CHECK:             %causal_1 = tl.cmp "<="
// CHECK:         %dk_gp = tl.gather {{.*}}[%dk_partner] axis 1
// CHECK:         tl.store
// CHECK:       tl.kernel @attn_bwd_dq(
// CHECK:         tl.for %start_n = {{.*}} to %full_hi step %BLOCK_N
// CHECK-NOT:       %causal
// CHECK:         tl.for %start_n_1 = %full_hi to %kv_hi step %BLOCK_N
// CHECK:           %causal = tl.cmp "<="
// CHECK:         %dq_gp = tl.gather {{.*}}[%dq_partner] axis 1
// CHECK:       tl.launcher "launch"(["q", "k", "v", "out_3", "lse_4", "dout_5"]) {
// CHECK:         tl.alloc "delta"
// CHECK:         tl.call "attn_bwd_pre"
// CHECK-NEXT:    tl.call "rotate_q"
// CHECK-NEXT:    tl.call "rotate_k"
// CHECK-NEXT:    tl.call "attn_bwd_dkdv"
// CHECK-NEXT:    tl.call "attn_bwd_dq"
// CHECK-NEXT:    tl.host_return ["dq", "dk", "dv"]

// Only dV: no dQ kernel, no dK store, no rotation back.
// DV:          tl.kernel @attn_bwd_dkdv(
// DV-NOT:        tl.gather
// DV-NOT:      tl.kernel @attn_bwd_dq(
// DV:            tl.call "attn_bwd_dkdv"
// DV-NEXT:       tl.host_return ["(dv,)"]
