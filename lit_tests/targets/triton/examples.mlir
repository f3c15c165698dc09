// Every bundled example lowers through the whole pipeline to a Triton kernel.
// RUN: attnfuse-opt %S/../../../attnfuse/examples/llama3_rope_causal.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE
// RUN: attnfuse-opt %S/../../../attnfuse/examples/gemma2_softcap_window.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,CAP
// RUN: attnfuse-opt %S/../../../attnfuse/examples/qwen3_qknorm_rope.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,NORM
// RUN: attnfuse-opt %S/../../../attnfuse/examples/bloom_alibi.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,ALIBI
// RUN: attnfuse-opt %S/../../../attnfuse/examples/gpt_oss_sinks_window.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,PRE,SINK
// RUN: attnfuse-opt %S/../../../attnfuse/examples/packed_documents.mlir -p attnfuse-pipeline -t triton | filecheck %s --check-prefixes=ALL,DOC

// PRE:        def rotate_k(
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
// ALL:        _launch(attn_fwd, (
// ALL:        return out, lse
// ALL:        LAUNCH_PARAMS = {
