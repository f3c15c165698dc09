// convert-attn-to-tl on a function kernel-path compiled for decoding: the split-KV kernel
// `attn_decode` (GQA packed: each row of the Q tile is a (query head, query) pair of one KV
// head; Q rotated at the queries' positions, K read as the cache holds it; keys past each
// sequence's length never loaded; a paged cache read through its page table) and the combine
// kernel `attn_decode_combine` (the splits' partials by their lse, the sink counted once),
// launched with the cost model's split count; where that is one, `attn_decode_single` alone (the
// same loop over the whole cache, the output and lse written directly, no workspaces).

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=90 decode=true}' | filecheck %s
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=90 decode=true page-size=16}' | filecheck %s --check-prefix=PAGE16
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=90 decode=true page-size=256}' | filecheck %s --check-prefix=PAGE256
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=90 decode=true page-size=16}' -t triton | filecheck %s --check-prefix=PY

// CHECK:      tl.kernel @attn_decode(
// CHECK-SAME:   %Seqlens: !tl.ptr<i32>, %OPart: !tl.ptr<f32>, %LPart: !tl.ptr<f32>, %NQ: i32, %SPLIT_KEYS: i32, %BLOCK_M: i32 constexpr, %BLOCK_N: i32 constexpr
// CHECK:        %split = tl.program_id 1 : i32
// CHECK:        %nk = tl.load
// CHECK:        %g = tl.minimum
// CHECK:        %h = tl.add
// CHECK:        %q_pos = tl.add %qi, %q_shift
// CHECK:        %q_rot = tl.add
// CHECK-NOT:    %k_rot
// CHECK:        tl.for
// CHECK:          %kv_ok = tl.cmp "<" %offs_n, %nk
// CHECK:          %k_blk = tl.add
// CHECK:      tl.kernel @attn_decode_combine(
// CHECK:        %sink2 = tl.mul %sink
// CHECK:      tl.kernel @attn_decode_single(
// CHECK-SAME:   %Seqlens: !tl.ptr<i32>, %Out: !tl.ptr<f16>, {{.*}} %Lse: !tl.ptr<f32>, %NQ: i32, %SPLIT_KEYS: i32
// CHECK:        tl.for
// CHECK:        %sink2 = tl.mul %sink, {{.*}} : !tl.tile<f32>, f32 -> !tl.tile<f32>
// CHECK:        %o_ptr = tl.add
// CHECK:      tl.launcher "launch"(["q", "k", "v", "sinks", "cache_seqlens"])
// CHECK:        tl.decode_splits "splits", "split_keys" rows "q.shape[0] * 2" length "k.shape[2]" block_n 128 waves 2 min_keys 256 fixed 0 device "q.device"
// CHECK-NEXT:   tl.host_assign "block_m" = "max(16, 1 << (2 * q.shape[2] - 1).bit_length())"
// CHECK:        tl.host_if "splits == 1" {
// CHECK-NEXT:     tl.call "attn_decode_single" grid ["q.shape[0] * 2", "splits"]
// CHECK-NEXT:   } else {
// CHECK-NEXT:     tl.alloc "o_part"
// CHECK-NEXT:     tl.alloc "lse_part"
// CHECK-NEXT:     tl.call "attn_decode" grid ["q.shape[0] * 2", "splits"]
// CHECK-NEXT:     tl.call "attn_decode_combine" grid ["q.shape[0] * 2", "2 * q.shape[2]"]

// Pages smaller than a block of keys: a page per key, masked to the sequence's length.
// PAGE16:      %pages = tl.load {{.*}} mask %kv_ok
// PAGE16:      tl.launcher "launch"(["q", "k", "v", "sinks", "cache_seqlens", "page_table"])
// PAGE16:      length "page_table.shape[1] * 16"

// Pages of a block or more: one page per block.
// PAGE256:     %page = tl.load
// PAGE256-NOT: %pages
// PAGE256:     tl.launcher

// PY: def attn_decode(q, stride_q, stride_q_1, stride_q_2, stride_q_3, k, {{.*}}, Seqlens, PageTable, stride_pt, stride_pt_1, OPart, LPart, NQ, SPLIT_KEYS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
// PY: def launch(q, k, v, sinks, cache_seqlens, page_table, *, lse=None):
// PY:     q_shape, q_device, page_table_shape = q.shape, q.device, page_table.shape
// PY:     splits, split_keys = _decode_splits(q_shape[0] * 2, page_table_shape[1] * 16, 128, 2, 256, 0, q_device)
func.func @llama_sinks(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %sinks: tensor<4xf32>) -> tensor<?x4x?x64xf16> {
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = 64 : tensor<?x4x?x64xf16>
  %kr = attn.rope %k half theta = 500000.0 rotary_dim = 64 : tensor<?x2x?x64xf16>
  %s = attn.qk %qr, %kr : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m sink(%sinks : tensor<4xf32>) : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}
