// The bundled example (Llama-3: RoPE with llama3 scaling, causal, GQA 32/8) through the
// whole pipeline and the triton target: readable Python with the @triton.jit kernels,
// the host launch() and the table of launch parameters. The output is valid Python.

// RUN: attnfuse-opt %S/../../../attnfuse/examples/llama3_rope_causal.mlir -p 'attnfuse-pipeline{sm=0}' -t triton | filecheck %s
// RUN: attnfuse-opt %S/../../../attnfuse/examples/llama3_rope_causal.mlir -p 'attnfuse-pipeline{sm=0 rope-mode=fused}' -t triton | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %S/../../../attnfuse/examples/llama3_rope_causal.mlir -p 'attnfuse-pipeline{sm=0}' -t triton > %t.py
// RUN: python -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" %t.py
// RUN: attnfuse-opt %S/../../../attnfuse/examples/llama3_rope_causal.mlir -p attnfuse-pipeline -t triton > %t90.py
// RUN: python -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" %t90.py
// RUN: filecheck %s --check-prefix=SM90 --input-file %t90.py

// CHECK:       import triton
// CHECK-NEXT:  import triton.language as tl

// At the default sequence length K is pre-rotated by its own kernel, launched first.
// CHECK:       @triton.jit
// CHECK-NEXT:  def rotate_k(k, {{.*}}, BLOCK_N: tl.constexpr, {{.*}}):
// CHECK:           tl.store(

// CHECK:       @triton.jit
// CHECK-NEXT:  def attn_fwd(q, stride_q, stride_q_1, stride_q_2, stride_q_3, k_rot, {{.*}}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr{{.*}}):
// The grid is (batch x heads, Q blocks); Q blocks run from the last (heaviest) one.
// CHECK-NEXT:      pid_bh = tl.program_id(0)
// CHECK-NEXT:      num_q_blocks = tl.num_programs(1)
// CHECK-NEXT:      q_block = tl.program_id(1)
// CHECK-NEXT:      pid_m = (num_q_blocks - 1) - q_block
// CHECK:           h_kv = h // 4
// The KV segments of the causal split (full blocks, then the masked diagonal), each with
// the dots and the base-2 softmax.
// CHECK:           for start_n in range(
// CHECK:               tl.dot(q_tile,
// CHECK:               tl.exp2(
// CHECK:               acc_new = tl.dot(p.to(tl.bfloat16), {{.*}}, acc_scaled)
// CHECK:           for start_n_1 in range(
// CHECK:               tl.dot(q_tile,
// CHECK:               tl.exp2(
// CHECK-NOT:       for start_n_2 in range(
// CHECK:           tl.store(o_ptr, out, mask=
// CHECK:           lse_base = Lse + ((tl.cast(pid_bh, tl.int64) * NQ) + m_off)
// CHECK-NEXT:      tl.store((lse_base + rows_m), lse, mask=row_ok)

// lse is a workspace the caller may pass (the runtime does when it discards it); strides go
// as one `*x.stride()[:r]` per tensor; a shape or device read more than once is read once;
// RoPE's inverse frequencies are a constant tuple; out is laid out in q's dimension order.
// CHECK:       def launch(q, k, v, *, lse=None):
// CHECK:           q_shape, q_device, k_shape = q.shape, q.device, k.shape
// CHECK-NEXT:      out = _empty_ordered(q, (q_shape[0], 32, q_shape[2], 128,), torch.bfloat16, q_device)
// CHECK-NEXT:      if lse is None:
// CHECK-NEXT:          lse = torch.empty((q_shape[0], 32, q_shape[2],), dtype=torch.float32, device=q_device)
// CHECK-NEXT:      k_rot = torch.empty((k_shape[0], 8, k_shape[2], 128,), dtype=torch.bfloat16, device=k.device)
// CHECK-NEXT:      rope_0_cos, rope_0_sin = _rope_table('rope_0_cos', (1.0, 0.8146172165870667,
// CHECK:           _launch(rotate_k, (_cdiv(k_shape[2], 32), k_shape[0] * 8,), 4, 1,
// CHECK-NEXT:              k, *k.stride()[:4], k_rot, *k_rot.stride()[:4], k_shape[2], 32,
// CHECK:           _launch(attn_fwd, (q_shape[0] * 32, _cdiv(q_shape[2], 32),), 4, 1,
// CHECK-NEXT:              q, *q.stride()[:4], k_rot, *k_rot.stride()[:4], v, *v.stride()[:4], out, *out.stride()[:4], lse,
// CHECK:           return out, lse

// CHECK:       LAUNCH_PARAMS = {
// CHECK-NEXT:      'rotate_k': {'grid': ['_cdiv(k.shape[2], 32)', 'k.shape[0] * 8'], 'num_warps': 4, 'num_stages': 1, 'constexprs': {'BLOCK_N': '32'}},
// CHECK-NEXT:      'attn_fwd': {'grid': ['q.shape[0] * 32', '_cdiv(q.shape[2], 32)'], 'num_warps': 4, 'num_stages': 1, 'constexprs': {'BLOCK_M': '32', 'BLOCK_N': '32'}},
// CHECK-NEXT:  }

// Fused: one kernel, K rotated inside the loop.
// FUSED-NOT:   def rotate_k
// FUSED:       def attn_fwd(q, {{.*}}, k, {{.*}}):
// FUSED:           for start_n in range(
// FUSED:               k_cos = tl.load(
// FUSED:               tl.dot(q_tile, k_tile)
// FUSED:       def launch(q, k, v, *, lse=None):
// FUSED-NOT:       k_rot
// FUSED:       LAUNCH_PARAMS = {
// FUSED-NEXT:      'attn_fwd':

// The sm90 launch parameters come from the tuning table.
// SM90:        LAUNCH_PARAMS = {
// SM90-NEXT:       'rotate_k': {{{.*}}},
// SM90-NEXT:       'attn_fwd': {'grid': ['q.shape[0] * 32', '_cdiv(q.shape[2], {{[0-9]+}})'], 'num_warps': {{[0-9]+}}, 'num_stages': {{[0-9]+}}, 'constexprs': {'BLOCK_M': '{{[0-9]+}}', 'BLOCK_N': '{{[0-9]+}}'}},
