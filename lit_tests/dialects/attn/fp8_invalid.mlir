// RUN: ATTN_VERIFY

// Broken attn.hadamard and attn.quantize ops, and a variant whose q and k are not rotated alike,
// one per chunk.

func.func @hadamard_head_dim(%q: tensor<?x8x?x96xf32>) {
  %h = attn.hadamard %q seed = 0 : tensor<?x8x?x96xf32>
  func.return
}
// CHECK: attn.hadamard needs a head dim that is a power of two, got 96

// -----

func.func @hadamard_seed(%q: tensor<?x8x?x64xf32>) {
  %h = attn.hadamard %q seed = -1 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.hadamard seed must be >= 0, got -1

// -----

func.func @quantize_block(%q: tensor<?x8x?x64xf32>) {
  %h = attn.quantize %q e4m3 block = -64 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.quantize block must be >= 0 rows (0: one scale per tensor), got -64

// -----

func.func @quantize_then_rope(%q: tensor<?x8x?x64xf32>) {
  %q8 = attn.quantize %q e4m3 block = 64 : tensor<?x8x?x64xf32>
  %r = attn.rope %q8 half theta = 10000.0 rotary_dim = 64 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.quantize must be the last transform before attn.qk or attn.pv, but its result feeds 'attn.rope'

// -----

func.func @hadamard_on_q_only(%q: tensor<?x8x?x64xf32>, %k: tensor<?x8x?x64xf32>) {
  %qh = attn.hadamard %q seed = 3 : tensor<?x8x?x64xf32>
  %s = attn.qk %qh, %k : tensor<?x8x?x64xf32>, tensor<?x8x?x64xf32> -> !attn.scores<8>
  func.return
}
// CHECK: attn.qk: q and k must go through the same attn.hadamard rotations (the scores are unchanged only then), got seeds [3] on q and [] on k

// -----

func.func @hadamard_seeds_differ(%q: tensor<?x8x?x64xf32>, %k: tensor<?x8x?x64xf32>) {
  %qh = attn.hadamard %q seed = 3 : tensor<?x8x?x64xf32>
  %kh = attn.hadamard %k seed = 4 : tensor<?x8x?x64xf32>
  %s = attn.qk %qh, %kh : tensor<?x8x?x64xf32>, tensor<?x8x?x64xf32> -> !attn.scores<8>
  func.return
}
// CHECK: got seeds [3] on q and [4] on k
