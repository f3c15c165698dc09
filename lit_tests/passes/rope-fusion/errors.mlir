// Bad options are reported as one diagnostic naming the option and what it accepts.

// RUN: not attnfuse-opt %s -p 'rope-fusion{mode=sometimes}' 2>&1 | filecheck %s --check-prefix=MODE
// MODE-NOT:    Traceback
// MODE:        attnfuse-opt: error: {{.*}}Incompatible types: given ('sometimes',), expected typing.Literal['auto', 'fused', 'prerotate']

// RUN: not attnfuse-opt %s -p 'rope-fusion{sm=7}' 2>&1 | filecheck %s --check-prefix=SM
// SM-NOT:      Traceback
// SM:          attnfuse-opt: error: rope-fusion sm must be 0 (the CPU interpreter) or a CUDA compute capability from 70 to 129 (e.g. 80, 90), got 7

// RUN: not attnfuse-opt %s -p 'rope-fusion{seq-len=0}' 2>&1 | filecheck %s --check-prefix=SEQ
// SEQ-NOT:     Traceback
// SEQ:         attnfuse-opt: error: rope-fusion seq-len must be >= 1, got 0

// RUN: not attnfuse-opt %s -p 'rope-fusion{block-m=64}' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// UNKNOWN-NOT: Traceback
// UNKNOWN:     attnfuse-opt: error: {{.*}}Provided arguments ["block_m"] not found in expected arguments ["mode", "sm", "seq_len"]

func.func @f(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 16 : tensor<?x2x?x16xf16>
  %s = attn.qk %q, %kr : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
