// Softcap, cap·tanh(s / cap), in the generic kernel: by the approximate tanh instruction where
// kernel-path chose it (tanh=approx, bf16/f16 for a GPU), in the forward and in both backward
// kernels that recompute the scores; else as cap·(2·sigmoid(2s/cap) - 1) (tanh=auto keeps the
// approximate instruction for the Gluon kernels, forward and backward; the interpreter never
// gets it).

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=80 tanh=approx}' | filecheck %s --check-prefix=FWD
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 tanh=approx}' | filecheck %s --check-prefix=EXACT
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=80}' | filecheck %s --check-prefix=EXACT
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=80 tanh=approx backward=true}' | filecheck %s --check-prefix=BWD
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=90 backward=true}' | filecheck %s --check-prefix=GLUONBWD

func.func @f(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>) -> tensor<?x4x?x64xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<4>
  %c = attn.softcap %s cap = 50.0 : !attn.scores<4>
  %m = attn.mask %c causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xbf16> -> tensor<?x4x?x64xbf16>
  func.return %o : tensor<?x4x?x64xbf16>
}

// FWD:         tl.kernel @attn_fwd(
// FWD-NOT:     tl.sigmoid
// FWD:         tl.fast_tanh
// FWD-NEXT:    tl.constant 5.000000e+01
// FWD-NEXT:    %s_capped = tl.mul
// FWD-NOT:     tl.sigmoid
// FWD:         tl.launcher

// BWD:         tl.kernel @attn_bwd_dkdv(
// BWD-NOT:     tl.sigmoid
// BWD:         tl.fast_tanh
// BWD:         tl.kernel @attn_bwd_dq(
// BWD-NOT:     tl.sigmoid
// BWD:         tl.fast_tanh
// BWD-NOT:     tl.sigmoid
// BWD:         tl.launcher

// EXACT-NOT:   tl.fast_tanh
// EXACT:       tl.sigmoid
// EXACT-NOT:   tl.fast_tanh

// The sm90 backward: its generic fallback kernels keep the exact form, the Gluon backward's P
// and dS functions take the instruction.
// GLUONBWD:      tl.kernel @attn_bwd_dkdv(
// GLUONBWD-NOT:  tl.fast_tanh
// GLUONBWD:      tl.sigmoid
// GLUONBWD-NOT:  tl.fast_tanh
// GLUONBWD:      tl.device_fn @gluon_bwd_full(
// GLUONBWD-NOT:  tl.sigmoid
// GLUONBWD:      tl.fast_tanh
// GLUONBWD:      tl.device_fn @gluon_bwd_masked(
// GLUONBWD-NOT:  tl.sigmoid
// GLUONBWD:      tl.fast_tanh
// GLUONBWD:      tl.launcher
