// Bad options: one diagnostic naming the option and its allowed values.

// RUN: not attnfuse-opt %s -p 'tiling{block-m=48}' 2>&1 | filecheck %s --check-prefix=BM
// BM-NOT:      Traceback
// BM:          attnfuse-opt: error: tiling block-m must be a power of two in [16, 256], got 48

// RUN: not attnfuse-opt %s -p 'tiling{block-n=512}' 2>&1 | filecheck %s --check-prefix=BN
// BN:          attnfuse-opt: error: tiling block-n must be a power of two in [16, 256], got 512

// RUN: not attnfuse-opt %s -p 'tiling{num-warps=3}' 2>&1 | filecheck %s --check-prefix=WARPS
// WARPS:       attnfuse-opt: error: tiling num-warps must be a power of two in [1, 16], got 3

// RUN: not attnfuse-opt %s -p 'tiling{num-stages=0}' 2>&1 | filecheck %s --check-prefix=STAGES
// STAGES-NOT:  Traceback
// STAGES:      attnfuse-opt: error: tiling num-stages must be in [1, 8], got 0

// RUN: not attnfuse-opt %s -p 'tiling{sm=7}' 2>&1 | filecheck %s --check-prefix=SM
// SM-NOT:      Traceback
// SM:          attnfuse-opt: error: tiling sm must be 0 (the CPU interpreter) or a CUDA compute capability from 70 to 129 (e.g. 80, 90), got 7

// RUN: not attnfuse-opt %s -p 'tiling{block-size=64}' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// UNKNOWN-NOT: Traceback
// UNKNOWN:     attnfuse-opt: error: {{.*}}Provided arguments ["block_size"] not found in expected arguments ["sm", "block_m", "block_n", "num_warps", "num_stages"]

func.func @f(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
