// Bad options are one diagnostic naming the option and what it accepts.

// RUN: not attnfuse-opt %s -p 'kernel-path{min-len=64}' 2>&1 | filecheck %s --check-prefix=MINLEN
// MINLEN-NOT: Traceback
// MINLEN:     attnfuse-opt: error: kernel-path min-len must be >= 128, got 64

// RUN: not attnfuse-opt %s -p 'kernel-path{sm=7}' 2>&1 | filecheck %s --check-prefix=SM
// SM:         attnfuse-opt: error: kernel-path sm must be 0 (the CPU interpreter) or a CUDA compute capability from 70 to 129 (e.g. 80, 90), got 7

// RUN: not attnfuse-opt %s -p 'kernel-path{path=gluon}' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// UNKNOWN:    attnfuse-opt: error: {{.*}}Provided arguments ["path"] not found in expected arguments ["sm", "seq_len", "gluon", "head_dims", "min_len", "min_len_fwd", "min_len_transformed", "tanh", "dq_reduce", "decode", "page_size", "splits", "varlen"]

// RUN: not attnfuse-opt %s -p 'kernel-path{tanh=fast}' 2>&1 | filecheck %s --check-prefix=TANH
// TANH-NOT:   Traceback
// TANH:       attnfuse-opt: error: {{.*}}Incompatible types: given ('fast',), expected typing.Literal['auto', 'approx', 'exact']

// RUN: not attnfuse-opt %s -p 'kernel-path{head-dims=32}' 2>&1 | filecheck %s --check-prefix=DIMS
// DIMS:       attnfuse-opt: error: kernel-path head-dims must be among 64, 128 and 256, got [32]

func.func @f(%q: tensor<?x2x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x2x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return %o : tensor<?x2x?x64xf16>
}
