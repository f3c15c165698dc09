// RUN: attnfuse-opt %s -p 'rope-fusion,causal-split,tiling{sm=0},convert-attn-to-tl' | filecheck %s
// RUN: attnfuse-opt %s -p 'rope-fusion,causal-split,tiling{sm=0},convert-attn-to-tl' | filecheck %s --check-prefix=GONE

// A causal GQA variant (4 query heads over 2 kv heads) becomes one tl.kernel, the
// FlashAttention-2 forward, and a tl.launcher. The KV loop is split in three: masked
// blocks before the full ones (none for causal: the loop is empty), full blocks with
// no mask code and no bounds checks, and the masked blocks on the diagonal.

func.func @causal(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x4x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x16xf16> -> tensor<?x4x?x16xf16>
  func.return %o : tensor<?x4x?x16xf16>
}

// The kernel's parameters: a pointer and four strides per tensor, the lengths, and the
// tile sizes as constexprs.
// CHECK:         tl.kernel @attn_fwd(%q: !tl.ptr<f16>, %stride_q: i32, %stride_q_1: i32, %stride_q_2: i32, %stride_q_3: i32, %k: !tl.ptr<f16>, %stride_k: i32, %stride_k_1: i32, %stride_k_2: i32, %stride_k_3: i32, %v: !tl.ptr<f16>, %stride_v: i32, %stride_v_1: i32, %stride_v_2: i32, %stride_v_3: i32, %Out: !tl.ptr<f16>, %stride_o: i32, %stride_o_1: i32, %stride_o_2: i32, %stride_o_3: i32, %Lse: !tl.ptr<f32>, %NQ: i32, %NK: i32, %BLOCK_M: i32 constexpr, %BLOCK_N: i32 constexpr) {

// One program per (Q tile, batch x head); query head h reads kv head h // 2.
// CHECK-NEXT:      %pid_bh = tl.program_id 0 : i32
// CHECK-NEXT:      %num_q_blocks = tl.num_programs 1 : i32
// CHECK-NEXT:      %[[ONE:.*]] = tl.constant 1 : i32
// CHECK-NEXT:      %[[LAST:.*]] = tl.sub %num_q_blocks, %[[ONE]]
// CHECK-NEXT:      %q_block = tl.program_id 1 : i32
// CHECK-NEXT:      %pid_m = tl.sub %[[LAST]], %q_block
// CHECK-NEXT:      %[[HQ:.*]] = tl.constant 4 : i32
// CHECK-NEXT:      %b = tl.floordiv %pid_bh, %[[HQ]]
// CHECK:           %h = tl.rem %pid_bh,
// CHECK-NEXT:      %[[GROUP:.*]] = tl.constant 2 : i32
// CHECK-NEXT:      %h_kv = tl.floordiv %h, %[[GROUP]]
// Offsets that grow with a tensor are int64 (a KV cache may pass 2^31 elements): batch,
// head and the Q block's first row, added to a scalar base pointer; the rows within the
// block stay int32.
// CHECK-NEXT:      %b_off = tl.cast %b : i32 -> i64
// CHECK-NEXT:      %h_off = tl.cast %h : i32 -> i64
// CHECK-NEXT:      %hk_off = tl.cast %h_kv : i32 -> i64
// CHECK-NEXT:      %m_start = tl.mul %pid_m, %BLOCK_M : i32, i32 -> i32
// CHECK-NEXT:      %m_off = tl.cast %m_start : i32 -> i64
// CHECK-NEXT:      %rows_m = tl.arange %BLOCK_M
// CHECK-NEXT:      %offs_m = tl.add %m_start, %rows_m
// Queries are the last NQ positions.
// CHECK:           %row_ok = tl.cmp "<" %offs_m, %NQ
// CHECK-NEXT:      %q_shift = tl.sub %NK, %NQ
// CHECK-NEXT:      %q_pos = tl.add %offs_m, %q_shift
// CHECK:           %offs_d = tl.arange
// CHECK-NEXT:      %[[QB:.*]] = tl.mul %b_off, %stride_q : i64, i32 -> i64
// CHECK-NEXT:      %[[Q1:.*]] = tl.add %q, %[[QB]] : !tl.ptr<f16>, i64 -> !tl.ptr<f16>
// CHECK-NEXT:      %[[QH:.*]] = tl.mul %h_off, %stride_q_1 : i64, i32 -> i64
// CHECK-NEXT:      %[[Q2:.*]] = tl.add %[[Q1]], %[[QH]] : !tl.ptr<f16>, i64 -> !tl.ptr<f16>
// CHECK-NEXT:      %[[QM:.*]] = tl.mul %m_off, %stride_q_2 : i64, i32 -> i64
// CHECK-NEXT:      %q_base = tl.add %[[Q2]], %[[QM]] : !tl.ptr<f16>, i64 -> !tl.ptr<f16>
// CHECK:           %[[QR:.*]] = tl.expand_dims %rows_m axis 1
// CHECK-NEXT:      %[[QRS:.*]] = tl.mul %[[QR]], %stride_q_2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
// CHECK-NEXT:      %{{.*}} = tl.add %q_base, %[[QRS]] : !tl.ptr<f16>, !tl.tile<i32> -> !tl.tile<!tl.ptr<f16>>

// Q prologue: one load, untouched (no transforms: no conversion either).
// CHECK:           %q_tile = tl.load %q_tile_ptr mask
// CHECK-NOT:       tl.cast %q_tile

// Online-softmax state.
// CHECK:           %m_i = tl.full %BLOCK_M value = 0xff800000 : f32 -> !tl.tile<f32>
// CHECK-NEXT:      %l_i = tl.full %BLOCK_M value = 0.000000e+00 : f32 -> !tl.tile<f32>
// CHECK:           %acc = tl.full %BLOCK_M, %{{.*}} value = 0.000000e+00 : f32 -> !tl.tile<f32>

// The segments, in order, threading m_i, l_i and acc. Blocks below the diagonal come
// first and are full: no bounds mask on the loads, no mask code. (The masked segment
// before them is statically empty for causal and is not emitted.)
// CHECK:           %[[M1:.*]], %[[L1:.*]], %[[A1:.*]] = tl.for %start_n = %{{.*}} to %full_hi step %BLOCK_N iter_args(%{{.*}} = %m_i, %{{.*}} = %l_i, %{{.*}} = %acc)
// CHECK-NOT:         mask
// The KV block's first row in int64, its rows in int32.
// CHECK:             %rows_n = tl.arange %BLOCK_N
// CHECK-NEXT:        %n_off = tl.cast %start_n : i32 -> i64
// CHECK-NEXT:        %[[KN:.*]] = tl.mul %n_off, %stride_k_2 : i64, i32 -> i64
// CHECK-NEXT:        %k_blk = tl.add %k_base, %[[KN]] : !tl.ptr<f16>, i64 -> !tl.ptr<f16>
// CHECK:             %[[KF:.*]] = tl.load %k_ptr : !tl.tile<!tl.ptr<f16>> -> !tl.tile<f16>
// The scale 1/sqrt(16) times log2(e) on the fp32 product (never on the 16-bit tiles): with
// only linear score ops it joins the max and exp2's argument (one fused multiply-add a score).
// CHECK-NEXT:        %qk = tl.dot %q_tile, %[[KF]] : !tl.tile<f16>, !tl.tile<f16> -> !tl.tile<f32>
// CHECK-NEXT:        %[[MAX:.*]] = tl.reduce max %qk axis 1
// CHECK-NEXT:        %[[SCALE:.*]] = tl.constant 0.360673755 : f32
// CHECK-NEXT:        %[[MAX2:.*]] = tl.mul %[[MAX]], %[[SCALE]]
// CHECK-NEXT:        %m_new = tl.maximum %{{.*}}, %[[MAX2]]
// CHECK-NOT:         mask
// Base-2 online softmax: exp2 of scores in log2 units.
// CHECK:             %[[S2:.*]] = tl.mul %qk, %{{.*}}
// CHECK:             %[[ARG:.*]] = tl.sub %[[S2]],
// CHECK-NEXT:        %p = tl.exp2 %[[ARG]]
// CHECK:             %alpha = tl.exp2
// CHECK-NOT:         mask
// CHECK:             %[[VN:.*]] = tl.mul %n_off, %stride_v_2 : i64, i32 -> i64
// CHECK-NEXT:        %v_blk = tl.add %v_base, %[[VN]] : !tl.ptr<f16>, i64 -> !tl.ptr<f16>
// CHECK:             %[[VF:.*]] = tl.load %v_ptr : !tl.tile<!tl.ptr<f16>> -> !tl.tile<f16>
// CHECK-NEXT:        %[[PF:.*]] = tl.cast %p : !tl.tile<f32> -> !tl.tile<f16>
// CHECK-NEXT:        %acc_new = tl.dot %[[PF]], %[[VF]] acc %acc_scaled
// CHECK-NEXT:        tl.yield
// CHECK-NEXT:      }

// The diagonal blocks: bounds and causal masks.
// CHECK-NEXT:      %[[M2:.*]], %[[L2:.*]], %[[A2:.*]] = tl.for %start_n_1 = %full_hi to %kv_hi step %BLOCK_N iter_args(%{{.*}} = %[[M1]], %{{.*}} = %[[L1]], %{{.*}} = %[[A1]])
// CHECK:             %kv_ok = tl.cmp "<" %offs_n, %NK
// CHECK:             %causal = tl.cmp "<="
// CHECK:             %s_masked = tl.where %causal,
// CHECK:             tl.yield
// CHECK-NEXT:      }
// CHECK-NOT:       tl.for

// Epilogue: a row with nothing kept has l = 0 and gives 0 (acc / 1), then the store
// and the natural-log log-sum-exp (m + log2 l) * ln 2, -inf for an empty row.
// CHECK:           %empty_row = tl.cmp "==" %[[L2]],
// CHECK:           %l_safe = tl.where %empty_row, %{{.*}}, %[[L2]]
// CHECK:           %[[O:.*]] = tl.truediv %[[A2]],
// CHECK-NEXT:      %out = tl.cast %[[O]] : !tl.tile<f32> -> !tl.tile<f16>
// CHECK:           %o_base = tl.add %{{.*}}, %{{.*}} : !tl.ptr<f16>, i64 -> !tl.ptr<f16>
// CHECK:           tl.store %out, %o_ptr mask
// CHECK:           %[[LOG:.*]] = tl.log2 %l_safe
// CHECK-NEXT:      %[[SUM:.*]] = tl.add %[[M2]], %[[LOG]]
// CHECK-NEXT:      %[[LN2:.*]] = tl.constant 0.693147182 : f32
// CHECK-NEXT:      %[[NAT:.*]] = tl.mul %[[SUM]], %[[LN2]]
// CHECK:           %lse = tl.where %empty_row, %{{.*}}, %[[NAT]]
// The log-sum-exp's row (b x h) x NQ in int64.
// CHECK-NEXT:      %[[BH:.*]] = tl.cast %pid_bh : i32 -> i64
// CHECK-NEXT:      %[[ROW:.*]] = tl.mul %[[BH]], %NQ : i64, i32 -> i64
// CHECK:           tl.store %lse, %{{.*}} mask %row_ok
// CHECK-NEXT:      tl.return
// CHECK-NEXT:    }

// The launcher: allocate out and lse, launch one program per (Q tile, b x h).
// CHECK-NEXT:    tl.launcher "launch"(["q", "k", "v"]) {
// CHECK-NEXT:      tl.alloc "out" shape ["q.shape[0]", "4", "q.shape[2]", "16"] dtype "torch.float16" device "q.device"
// CHECK-NEXT:      tl.alloc "lse" shape ["q.shape[0]", "4", "q.shape[2]"] dtype "torch.float32" device "q.device"
// CHECK-NEXT:      tl.call "attn_fwd" grid ["q.shape[0] * 4", "_cdiv(q.shape[2], 32)"] args ["q", "q.stride(0)", "q.stride(1)", "q.stride(2)", "q.stride(3)", "k", "k.stride(0)", "k.stride(1)", "k.stride(2)", "k.stride(3)", "v", "v.stride(0)", "v.stride(1)", "v.stride(2)", "v.stride(3)", "out", "out.stride(0)", "out.stride(1)", "out.stride(2)", "out.stride(3)", "lse", "q.shape[2]", "k.shape[2]", "32", "32"] num_warps 4 num_stages 1
// CHECK-NEXT:      tl.host_return ["out", "lse"]
// CHECK-NEXT:    }
// CHECK-NEXT:  }

// The attn function is gone.
// GONE-NOT:    func.func
// GONE-NOT:    attn.
