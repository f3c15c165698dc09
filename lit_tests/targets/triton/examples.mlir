// Every bundled example lowers through the whole pipeline to a Triton kernel.
// (sm 90 by default: the examples take the sm90 Gluon kernel beside the generic
// one, with their score ops as generated functions unless they are a causal mask, and Q's plain
// RoPE and QK-norm applied in it; gpt-oss's head dim 64 takes it too, with 192-row tiles.)
// RUN: attnfuse-opt %S/../../../attnfuse/examples/llama3_rope_causal.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,GLUON,LLAMA
// RUN: attnfuse-opt %S/../../../attnfuse/examples/gemma2_softcap_window.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,CAP,GLUON,HOOKS,HCAP
// Gemma 2's softcap: tanh.approx in the Gluon kernel's functions (tanh=auto), in both kernels
// with tanh=approx, in neither with tanh=exact (2·sigmoid(2x/cap) - 1):
// RUN: attnfuse-opt %S/../../../attnfuse/examples/gemma2_softcap_window.mlir -p 'attnfuse-pipeline{tanh=approx}' -t triton | filecheck %s --check-prefix=APPROX
// RUN: attnfuse-opt %S/../../../attnfuse/examples/gemma2_softcap_window.mlir -p 'attnfuse-pipeline{tanh=exact}' -t triton | filecheck %s --check-prefix=EXACT
// RUN: attnfuse-opt %S/../../../attnfuse/examples/qwen3_qknorm_rope.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,NORM,GLUON,QWEN
// RUN: attnfuse-opt %S/../../../attnfuse/examples/bloom_alibi.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,ALIBI,GLUON,HOOKS,HALIBI
// RUN: attnfuse-opt %S/../../../attnfuse/examples/gpt_oss_sinks_window.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,SINK,GLUON,HOOKS,GPTOSS
// RUN: attnfuse-opt %S/../../../attnfuse/examples/packed_documents.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,DOC,GLUON,HOOKS,HDOC

// CAP:        def _fast_tanh(x):
// CAP-NEXT:     """tanh(x) by `tanh.approx.f32`
// EXACT-NOT:  _fast_tanh
// EXACT:      def attn_fwd(
// EXACT:        tl.sigmoid(
// EXACT:      def gluon_score(
// EXACT:        tl.sigmoid(
// APPROX:     def attn_fwd(
// APPROX-NOT:   tl.sigmoid(
// APPROX:       _fast_tanh(
// APPROX:     def gluon_score(
// GLUON:      def attn_fwd_sm90(
// GLUON:      def _gluon_attention(
// PRE:        def rotate_k(
// GLUON-NOT:  def rotate_q(
// NORM:       tl.rsqrt(
// ALL:        @triton.jit
// ALL-NEXT:   def attn_fwd(
// NORM:       tl.rsqrt(
// DOC:        doc_q = tl.load(
// ALL:        for start_n in range(
// ALL:        tl.dot(
// CAP:        tl.sigmoid(
// ALIBI:      slope = tl.load(
// ALL:        tl.exp2(
// SINK:       sink = tl.load(
// ALL:        tl.store(
// HOOKS:      def gluon_kv_range(q_lo, q_hi, NK):
// HOOKS:        return
// HCAP:       def gluon_score(s, q_idx, kv_idx, off_hz):
// HCAP:         s_capped = _fast_tanh(
// HCAP:       def gluon_score_masked(s, q_idx, kv_idx, off_hz):
// HCAP:         in_window = (t >= 0) & (t < 4096)
// HALIBI:     def gluon_score(s, q_idx, kv_idx, off_hz, slopes, stride_slopes):
// HALIBI:     def gluon_score_masked(s, q_idx, kv_idx, off_hz, slopes, stride_slopes):
// HDOC:       def gluon_score_masked(s, q_idx, kv_idx, off_hz, doc_ids, stride_doc_ids, stride_doc_ids_1):
// HDOC:         same_doc = doc_q == doc_k
// ALL:        def launch(
// PRE:        _launch(rotate_k, (
// GLUON:      if _gluon_fits(q, k, v, {{[0-9]+}}):
// LLAMA-NEXT:     _gluon_attention(q, k_rot, v, out, lse, 0.08838834764831843, causal=True, rope=(rope_0_cos, rope_0_sin, 0))
// QWEN-NEXT:      _gluon_attention(q, k_rot, v, out, lse, 0.08838834764831843, causal=True, rope=(rope_0_cos, rope_0_sin, 0), q_norm=(q_norm_weight, 1e-06))
// HCAP:           _gluon_attention(q, k_rot, v, out, lse, 0.0625, causal=False, hooks=(gluon_kv_range, gluon_score, gluon_score_masked), natural=True, rope=(rope_0_cos, rope_0_sin, 0))
// HALIBI:         _gluon_attention(q, k, v, out, lse, {{.*}}, causal=False, hooks=(gluon_kv_range, gluon_score, gluon_score_masked), xargs=(slopes, slopes.stride(0),), natural=True)
// HDOC:           _gluon_attention(q, k, v, out, lse, {{.*}}, causal=False, hooks=(gluon_kv_range, None, gluon_score_masked), xargs=(doc_ids, *doc_ids.stride()[:2],))
// GPTOSS:         _gluon_attention(q, k_rot, v, out, lse, 0.125, causal=False, sink=sinks, hooks=(gluon_kv_range, None, gluon_score_masked), rope=(rope_0_cos, rope_0_sin, 0))
// GLUON-NEXT: else:
// ALL:        _launch(attn_fwd, (
// ALL:        return out, lse
// ALL:        LAUNCH_PARAMS = {
