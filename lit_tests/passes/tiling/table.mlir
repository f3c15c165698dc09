// tiling: BLOCK_M, BLOCK_N, num_warps and num_stages from the tuning table, by SM
// version, head-dim bucket (<= 64, <= 128, <= 256) and variant class (plain; kloop: K
// transformed in the KV loop; mods: softcap / bias / score_mod). Unknown SM versions
// use the nearest known architecture below them; classes without an entry use the
// bucket's plain one. Only the function attribute `attn.tiling` is added.

// RUN: attnfuse-opt %s --split-input-file -p 'tiling{sm=80}' | filecheck %s --check-prefix=SM80
// RUN: attnfuse-opt %s --split-input-file -p 'tiling{sm=86}' | filecheck %s --check-prefix=SM80
// RUN: attnfuse-opt %s --split-input-file -p 'tiling{sm=0}' | filecheck %s --check-prefix=SM0
// The sm90 entries are measured on the GPU (benchmarks/) and change with re-tuning:
// only the lookup's structure is checked for them.
// RUN: attnfuse-opt %s --split-input-file -p tiling | filecheck %s --check-prefix=SM90
// RUN: attnfuse-opt %s --split-input-file -p 'tiling{sm=100}' | filecheck %s --check-prefix=SM90

func.func @d64(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// SM80-LABEL: func.func @d64(
// SM80-SAME: attn.tiling = {block_m = 128 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64, class = "plain"}
// SM0-LABEL: func.func @d64(
// SM0-SAME: attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, class = "plain"}
// SM90-LABEL: func.func @d64(
// SM90-SAME: attn.tiling = {block_m = {{[0-9]+}} : i64, block_n = {{[0-9]+}} : i64, num_warps = {{[0-9]+}} : i64, num_stages = {{[0-9]+}} : i64, class = "plain"}

// -----

// 80 is in the <= 128 bucket (the kernel pads it to 128 with masks).
func.func @d80(%q: tensor<?x4x?x80xf16>, %k: tensor<?x2x?x80xf16>, %v: tensor<?x2x?x80xf16>) -> tensor<?x4x?x80xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x80xf16>, tensor<?x2x?x80xf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x80xf16> -> tensor<?x4x?x80xf16>
  func.return %o : tensor<?x4x?x80xf16>
}

// SM80-LABEL: func.func @d80(
// SM80-SAME: attn.tiling = {block_m = 128 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 2 : i64, class = "plain"}
// SM0-LABEL: func.func @d80(
// SM0-SAME: attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, class = "plain"}
// SM90-LABEL: func.func @d80(
// SM90-SAME: attn.tiling = {block_m = {{[0-9]+}} : i64, block_n = {{[0-9]+}} : i64, num_warps = {{[0-9]+}} : i64, num_stages = {{[0-9]+}} : i64, class = "plain"}

// -----

func.func @d128(%q: tensor<?x4x?x128xf16>, %k: tensor<?x2x?x128xf16>, %v: tensor<?x2x?x128xf16>) -> tensor<?x4x?x128xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xf16>, tensor<?x2x?x128xf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x128xf16> -> tensor<?x4x?x128xf16>
  func.return %o : tensor<?x4x?x128xf16>
}

// SM80-LABEL: func.func @d128(
// SM80-SAME: attn.tiling = {block_m = 128 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 2 : i64, class = "plain"}
// SM0-LABEL: func.func @d128(
// SM0-SAME: attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, class = "plain"}
// SM90-LABEL: func.func @d128(
// SM90-SAME: attn.tiling = {block_m = {{[0-9]+}} : i64, block_n = {{[0-9]+}} : i64, num_warps = {{[0-9]+}} : i64, num_stages = {{[0-9]+}} : i64, class = "plain"}

// -----

func.func @d256(%q: tensor<?x4x?x256xf16>, %k: tensor<?x2x?x256xf16>, %v: tensor<?x2x?x256xf16>) -> tensor<?x4x?x256xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x256xf16>, tensor<?x2x?x256xf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x256xf16> -> tensor<?x4x?x256xf16>
  func.return %o : tensor<?x4x?x256xf16>
}

// SM80-LABEL: func.func @d256(
// SM80-SAME: attn.tiling = {block_m = 64 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 2 : i64, class = "plain"}
// SM0-LABEL: func.func @d256(
// SM0-SAME: attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, class = "plain"}
// SM90-LABEL: func.func @d256(
// SM90-SAME: attn.tiling = {block_m = {{[0-9]+}} : i64, block_n = {{[0-9]+}} : i64, num_warps = {{[0-9]+}} : i64, num_stages = {{[0-9]+}} : i64, class = "plain"}

// -----

// A softcap makes the variant `mods`; sm80 and sm0 have no such entry: plain's is used.
func.func @softcap_d64(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
  %c = attn.softcap %s cap = 30.0 : !attn.scores<4>
  %p = attn.softmax %c : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// SM80-LABEL: func.func @softcap_d64(
// SM80-SAME: attn.tiling = {block_m = 128 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64, class = "mods"}
// SM0-LABEL: func.func @softcap_d64(
// SM0-SAME: attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, class = "mods"}
// SM90-LABEL: func.func @softcap_d64(
// SM90-SAME: attn.tiling = {block_m = {{[0-9]+}} : i64, block_n = {{[0-9]+}} : i64, num_warps = {{[0-9]+}} : i64, num_stages = {{[0-9]+}} : i64, class = "mods"}

