// The varlen path (kernel-path{varlen=true}): the generic forward over packed sequences. Each
// program (sequence x head, Q block) reads its sequence's first query and key and its lengths
// from cu_seqlens, addresses Q, K, V, out and lse from there, takes positions within its
// sequence, and visits no keys past its sequence's last Q block. K's RoPE runs in the KV loop.

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=90 varlen=true}' | filecheck %s
// RUN: attnfuse-opt %s -p 'kernel-path{varlen=true},rope-fusion' | filecheck %s --check-prefix=PATH
// RUN: not attnfuse-opt %s -p 'kernel-path{varlen=true decode=true}' 2>&1 | filecheck %s --check-prefix=BOTH

// PATH:      attn.kernel_path = {path = "varlen", reason = "packed sequences"}
// PATH-SAME: attn.rope_fusion = {k = "kv_loop", reason = "packed sequences: K rotated at positions within its sequence"}
// BOTH:      kernel-path takes decode=true or varlen=true, not both

// CHECK:      tl.kernel @attn_fwd(
// CHECK-SAME:   %Lse: !tl.ptr<f32>, %CuQ: !tl.ptr<i32>, %CuK: !tl.ptr<i32>, %TQ: i32, %BLOCK_M: i32 constexpr, %BLOCK_N: i32 constexpr
// CHECK:        %seq = tl.floordiv %pid_bh
// CHECK:        %q_start = tl.load
// CHECK:        %nq = tl.sub {{.*}}, %q_start
// CHECK:        %k_start = tl.load
// CHECK:        %nk_seq = tl.sub {{.*}}, %k_start
// CHECK:        %nk = tl.where {{.*}}, %nk_seq
// CHECK:        %q_shift = tl.sub %nk_seq, %nq
// CHECK:        %k_row0 = tl.cast %k_start
// CHECK:        %k_seq = tl.add %k_base
// CHECK:        tl.for
// CHECK:          %k_blk = tl.add %k_seq
// CHECK:          %k_rot = tl.add
// CHECK:        %lse_base = tl.add %Lse, %lse_row0
// CHECK:      tl.launcher "launch"(["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q"])
// CHECK:        tl.call "attn_fwd" grid ["(cu_seqlens_q.shape[0] - 1) * 4", "_cdiv(max_seqlen_q, 128)"]
func.func @llama(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = 64 : tensor<?x4x?x64xf16>
  %kr = attn.rope %k half theta = 500000.0 rotary_dim = 64 : tensor<?x2x?x64xf16>
  %s = attn.qk %qr, %kr : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// The backward on the varlen path: the generic backward's kernels with each program's rows
// addressed from its sequence's first query and key, and pre-rotation kernels that read each
// packed token's position in its sequence.

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=90 varlen=true backward=true}' -t triton | filecheck %s --check-prefix=BWD
// BWD:      def rotate_q({{.*}}, PosQ, rope_0_cos, rope_0_sin):
// BWD:          q_pos = tl.load((PosQ + offs_n), mask=(offs_n < NQ), other=0)
// BWD:      def attn_bwd_dkdv(
// BWD:          seq = pid_bh // 2
// BWD:          nq = tl.where((n_start < nk), nq_seq, 0)
// BWD:          n_off = tl.cast((k_start + n_start), tl.int64)
// BWD:              m_seq = m_off + q_row0
// BWD:      def attn_bwd_dq(
// BWD:          k_seq = {{.*}} + (k_row0 * stride_k_rot_2)
// BWD:      def launch(q, k, v, out_3, lse_4, dout_5, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, positions_q, positions_k):
// BWD:          _launch(attn_bwd_dkdv, (_cdiv(max_seqlen_k, 64), (cu_seqlens_q_shape[0] - 1) * 2,)
// BWD:          _launch(attn_bwd_dq, ((cu_seqlens_q_shape[0] - 1) * 4, _cdiv(max_seqlen_q, 64),)
