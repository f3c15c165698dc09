// Every bundled example lowers through the whole pipeline to a Triton kernel.
// (sm 90 by default: Llama-3 and Qwen3, causal with RoPE / QK-norm, take the sm90 Gluon
// kernel beside the generic one; the others' score ops keep them on the generic kernel.)
// RUN: attnfuse-opt %S/../../../attnfuse/examples/llama3_rope_causal.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,GLUON
// RUN: attnfuse-opt %S/../../../attnfuse/examples/gemma2_softcap_window.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,CAP,GENERIC
// RUN: attnfuse-opt %S/../../../attnfuse/examples/qwen3_qknorm_rope.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,NORM,GLUON
// RUN: attnfuse-opt %S/../../../attnfuse/examples/bloom_alibi.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,ALIBI,GENERIC
// RUN: attnfuse-opt %S/../../../attnfuse/examples/gpt_oss_sinks_window.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,SINK,GENERIC
// RUN: attnfuse-opt %S/../../../attnfuse/examples/packed_documents.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,DOC,GENERIC

// GENERIC-NOT: gluon
// GLUON:      def attn_fwd_sm90(
// GLUON:      def _gluon_attention(
// PRE:        def rotate_k(
// GLUON:      def rotate_q(
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
// ALL:        def launch(
// PRE:        _launch(rotate_k, (
// GLUON:      if _gluon_fits(q, k, v, 4096):
// GLUON-NEXT:     q_rot = torch.empty(
// GLUON-NEXT:     _launch(rotate_q, (
// GLUON:          _gluon_attention(q_rot, k_rot, v, out, lse, 0.08838834764831843, causal=True)
// GLUON-NEXT: else:
// ALL:        _launch(attn_fwd, (
// ALL:        return out, lse
// ALL:        LAUNCH_PARAMS = {
