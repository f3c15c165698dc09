// Options override the table entry by entry; the rest still comes from the table.

// RUN: attnfuse-opt %s -p 'tiling{sm=80 block-m=64 block-n=16 num-warps=2 num-stages=4}' | filecheck %s --check-prefix=ALL
// RUN: attnfuse-opt %s -p 'tiling{sm=80 block-n=128}' | filecheck %s --check-prefix=ONE
// The SM version can also come from the module's attn.target.
// RUN: sed -e 's/^func.func/builtin.module attributes {attn.target = {sm = 0 : i64}} { func.func/' -e 's/^}$/} }/' %s | attnfuse-opt -p tiling | filecheck %s --check-prefix=TARGET
// RUN: sed -e 's/^func.func/builtin.module attributes {attn.target = {sm = 0 : i64}} { func.func/' -e 's/^}$/} }/' %s | attnfuse-opt -p 'tiling{sm=80}' | filecheck %s --check-prefix=SM80

func.func @f(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// ALL:    attn.tiling = {block_m = 64 : i64, block_n = 16 : i64, num_warps = 2 : i64, num_stages = 4 : i64, class = "plain"}
// ONE:    attn.tiling = {block_m = 128 : i64, block_n = 128 : i64, num_warps = 4 : i64, num_stages = 3 : i64, class = "plain"}
// TARGET: attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, class = "plain"}
// SM80:   attn.tiling = {block_m = 128 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64, class = "plain"}
