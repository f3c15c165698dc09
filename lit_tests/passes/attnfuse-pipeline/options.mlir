// attnfuse-pipeline's options reach their stages.

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 rope-mode=prerotate block-m=16 block-n=64 num-warps=2 num-stages=2}' | filecheck %s --check-prefix=OPTS
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 rope-mode=fused}' | filecheck %s --check-prefix=FUSED

// Bad options fail the same way as the stage's own.
// RUN: not attnfuse-opt %s -p 'attnfuse-pipeline{rope-mode=always}' 2>&1 | filecheck %s --check-prefix=BADMODE
// RUN: not attnfuse-opt %s -p 'attnfuse-pipeline{block-m=48}' 2>&1 | filecheck %s --check-prefix=BADBLOCK
// RUN: not attnfuse-opt %s -p 'attnfuse-pipeline{tile=64}' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not attnfuse-opt %s -p 'attnfuse-pipeline{sm=7}' 2>&1 | filecheck %s --check-prefix=BADSM

// wrt picks the backward's gradients: without backward=true it is an error, not ignored.
// RUN: not attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 wrt=2,0}' 2>&1 | filecheck %s --check-prefix=WRT
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 backward=true wrt=2}' | filecheck %s --check-prefix=WRTBWD

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>) -> tensor<?x4x?x32xf16> {
  %kr = attn.rope %k interleaved theta = 10000.0 rotary_dim = 32 : tensor<?x2x?x32xf16>
  %s = attn.qk %q, %kr : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// OPTS:          tl.kernel @rotate_k(
// OPTS:          tl.kernel @attn_fwd(
// OPTS:          tl.call "rotate_k"
// OPTS-NEXT:     tl.call "attn_fwd" grid ["q.shape[0] * 4", "_cdiv(q.shape[2], 16)"] args [{{.*}}, "lse", "q.shape[2]", "k.shape[2]", "16", "64"] num_warps 2 num_stages 2

// FUSED-NOT:     rotate_k
// FUSED:         tl.call "attn_fwd" grid ["q.shape[0] * 4", "_cdiv(q.shape[2], 32)"] args [{{.*}}, "32", "32"{{.*}}] num_warps 4 num_stages 1

// BADMODE:       attnfuse-opt: error: {{.*}}Incompatible types: given ('always',), expected typing.Literal['auto', 'fused', 'prerotate']
// BADBLOCK:      attnfuse-opt: error: tiling block-m must be a power of two in [16, 256], got 48
// UNKNOWN:       attnfuse-opt: error: {{.*}}Provided arguments ["tile"] not found in expected arguments
// BADSM:         attnfuse-opt: error: attnfuse-pipeline sm must be 0 (the CPU interpreter) or a CUDA compute capability from 70 to 129 (e.g. 80, 90), got 7
// WRT-NOT:       Traceback
// WRT:           attnfuse-opt: error: attnfuse-pipeline wrt=2,0 needs backward=true: wrt picks the arguments the backward differentiates, and the forward has none
// WRTBWD:        tl.launcher "launch"
// WRTBWD:        tl.host_return ["(dv,)"]
