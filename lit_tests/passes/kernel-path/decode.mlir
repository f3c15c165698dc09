// kernel-path{decode=true}: a forward compiled for decoding against a KV cache (Variant.decode).
// The entry records the cache's layout (page_size 0: contiguous) and the split cost model;
// rope-fusion then places K's transforms in the cache (cache_keys applies them), and tiling
// takes the decode class.

// RUN: attnfuse-opt %s -p 'kernel-path{sm=90 decode=true}' | filecheck %s
// RUN: attnfuse-opt %s -p 'kernel-path{sm=90 decode=true page-size=64 splits=8},rope-fusion{sm=90},tiling{sm=90}' | filecheck %s --check-prefix=PAGED
// RUN: attnfuse-opt %s -p 'kernel-path{sm=90 decode=true tanh=approx}' | filecheck %s --check-prefix=TANH
// RUN: not attnfuse-opt %s -p 'kernel-path{decode=true page-size=24}' 2>&1 | filecheck %s --check-prefix=PAGE
// RUN: not attnfuse-opt %s -p 'kernel-path{page-size=64}' 2>&1 | filecheck %s --check-prefix=NODECODE

// CHECK:  attn.kernel_path = {path = "decode", page_size = 0 : i64, waves = 2 : i64, min_split_keys = 256 : i64, splits = 0 : i64}
// PAGED:  attn.kernel_path = {path = "decode", page_size = 64 : i64, waves = 2 : i64, min_split_keys = 256 : i64, splits = 8 : i64}
// PAGED-SAME: attn.rope_fusion = {k = "cache", reason = "a decode kernel reads K as cache_keys wrote it"}
// PAGED-SAME: attn.tiling = {block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, class = "decode"}
// PAGED:      attn.rope %q {{.*}}placement = #attn.placement<q_prologue>
// PAGED-NEXT: attn.rope %k {{.*}}placement = #attn.placement<cache>
// TANH:   tanh = "approx"
// PAGE:   kernel-path page-size must be 0 or a power of two in [16, 256], got 24
// NODECODE: kernel-path page-size and splits need decode=true
func.func @gemma(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 128 : tensor<?x32x?x128xbf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<32>
  %c = attn.softcap %s cap = 50.0 : !attn.scores<32>
  %m = attn.mask %c sliding_window(4096) : !attn.scores<32>
  %p = attn.softmax %m : !attn.scores<32> -> !attn.probs<32>
  %o = attn.pv %p, %v : !attn.probs<32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
