// The Rotation Calculus: with mode=auto, K's rotation stays in the KV loop while its
// redundant per-tile cost (Q tiles x N x D rotations, halved by a causal mask) is below
// one extra read and write of K plus a launch, and moves to a pre-rotation kernel at
// long sequences. (The crossover itself depends on the GPU model's measured rates, so
// only lengths far from it are checked here.)

// RUN: attnfuse-opt %s -p 'rope-fusion{seq-len=64}' | filecheck %s --check-prefix=SHORT
// RUN: attnfuse-opt %s -p 'rope-fusion{mode=auto seq-len=65536}' | filecheck %s --check-prefix=LONG
// RUN: attnfuse-opt %s -p 'rope-fusion{sm=80 seq-len=64}' | filecheck %s --check-prefix=SM80-SHORT
// RUN: attnfuse-opt %s -p 'rope-fusion{sm=80 seq-len=65536}' | filecheck %s --check-prefix=SM80-LONG

// Explicit modes override the cost model either way.
// RUN: attnfuse-opt %s -p 'rope-fusion{mode=fused seq-len=65536}' | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s -p 'rope-fusion{mode=prerotate seq-len=64}' | filecheck %s --check-prefix=PREROTATE

// Without options the module's attn.target is read, then sm 90 / seq-len 4096.
// RUN: attnfuse-opt %s -p rope-fusion | filecheck %s --check-prefix=DEFAULT
// RUN: sed -e 's/^func.func/builtin.module attributes {attn.target = {sm = 80 : i64, seq_len = 65536 : i64}} { func.func/' -e 's/^}$/} }/' %s | attnfuse-opt -p rope-fusion | filecheck %s --check-prefix=TARGET
// RUN: sed -e 's/^func.func/builtin.module attributes {attn.target = {sm = 80 : i64, seq_len = 65536 : i64}} { func.func/' -e 's/^}$/} }/' %s | attnfuse-opt -p 'rope-fusion{seq-len=64}' | filecheck %s --check-prefix=OVERRIDE

func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x8x?x64xf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x8x?x64xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 64 : tensor<?x2x?x64xf16>
  %s = attn.qk %qr, %kr : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x64xf16> -> tensor<?x8x?x64xf16>
  func.return %o : tensor<?x8x?x64xf16>
}

// The decision comes with both predicted costs.
// SHORT:       attn.rope_fusion = {k = "kv_loop", sm = 90 : i64, seq_len = 64 : i64, fused_us = {{[0-9.e+-]+}} : f64, prerotate_us = {{[0-9.e+-]+}} : f64}
// SHORT:       %qr = attn.rope {{.*}} {placement = #attn.placement<q_prologue>}
// SHORT-NEXT:  %kr = attn.rope {{.*}} {placement = #attn.placement<kv_loop>}

// LONG:        attn.rope_fusion = {k = "prerotate", sm = 90 : i64, seq_len = 65536 : i64
// LONG:        %qr = attn.rope {{.*}} {placement = #attn.placement<q_prologue>}
// LONG-NEXT:   %kr = attn.rope {{.*}} {placement = #attn.placement<prerotate>}

// SM80-SHORT:  attn.rope_fusion = {k = "kv_loop", sm = 80 : i64, seq_len = 64 : i64
// SM80-LONG:   attn.rope_fusion = {k = "prerotate", sm = 80 : i64, seq_len = 65536 : i64

// FUSED:       attn.rope_fusion = {k = "kv_loop", sm = 90 : i64, seq_len = 65536 : i64
// FUSED:       %kr = attn.rope {{.*}} {placement = #attn.placement<kv_loop>}
// PREROTATE:   attn.rope_fusion = {k = "prerotate", sm = 90 : i64, seq_len = 64 : i64
// PREROTATE:   %kr = attn.rope {{.*}} {placement = #attn.placement<prerotate>}

// DEFAULT:     attn.rope_fusion = {k = "prerotate", sm = 90 : i64, seq_len = 4096 : i64
// TARGET:      attn.rope_fusion = {k = "prerotate", sm = 80 : i64, seq_len = 65536 : i64
// OVERRIDE:    attn.rope_fusion = {k = "kv_loop", sm = 80 : i64, seq_len = 64 : i64
