// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// Every form of attn.rope: both styles, partial rotary, each scaling scheme
// (required parameters only and with every parameter), an explicit inv_freq operand,
// and a discardable attribute.

func.func @rope(%q: tensor<?x8x?x64xf16>, %k: tensor<2x2x?x64xbf16>, %f: tensor<16xf32>) {
  %half = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x8x?x64xf16>
  %inter = attn.rope %k interleaved theta = 10000.0 rotary_dim = 64 : tensor<2x2x?x64xbf16>
  %partial = attn.rope %q half theta = 10000.0 rotary_dim = 32 : tensor<?x8x?x64xf16>
  %small = attn.rope %q interleaved theta = 1.5 rotary_dim = 2 : tensor<?x8x?x64xf16>
  %linear = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<linear, factor = 4.0> : tensor<?x8x?x64xf16>
  %llama3 = attn.rope %q half theta = 500000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0> : tensor<?x8x?x64xf16>
  %llama3_all = attn.rope %q half theta = 500000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192.0> : tensor<?x8x?x64xf16>
  %yarn = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 4.0, original_max_position = 4096.0> : tensor<?x8x?x64xf16>
  %yarn_all = attn.rope %k interleaved theta = 1000000.0 rotary_dim = 32 scaling = #attn.rope_scaling<yarn, factor = 40.0, original_max_position = 4096.0, beta_fast = 32.0, beta_slow = 1.0, attention_factor = 1.25, truncate = false> : tensor<2x2x?x64xbf16>
  %explicit = attn.rope %q half theta = 10000.0 rotary_dim = 32 inv_freq(%f : tensor<16xf32>) : tensor<?x8x?x64xf16>
  %tagged = attn.rope %q half theta = 10000.0 rotary_dim = 64 {note = "q"} : tensor<?x8x?x64xf16>
  func.return
}

// CHECK-LABEL: func.func @rope(%q: tensor<?x8x?x64xf16>, %k: tensor<2x2x?x64xbf16>, %f: tensor<16xf32>) {
// CHECK-NEXT:    %half = attn.rope %q half theta = 10000.0 rotary_dim = 64 : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %inter = attn.rope %k interleaved theta = 10000.0 rotary_dim = 64 : tensor<2x2x?x64xbf16>
// CHECK-NEXT:    %partial = attn.rope %q half theta = 10000.0 rotary_dim = 32 : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %small = attn.rope %q interleaved theta = 1.5 rotary_dim = 2 : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %linear = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<linear, factor = 4.0> : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %llama3 = attn.rope %q half theta = 500000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0> : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %llama3_all = attn.rope %q half theta = 500000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192.0> : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %yarn = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 4.0, original_max_position = 4096.0> : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %yarn_all = attn.rope %k interleaved theta = 1000000.0 rotary_dim = 32 scaling = #attn.rope_scaling<yarn, factor = 40.0, original_max_position = 4096.0, beta_fast = 32.0, beta_slow = 1.0, attention_factor = 1.25, truncate = false> : tensor<2x2x?x64xbf16>
// CHECK-NEXT:    %explicit = attn.rope %q half theta = 10000.0 rotary_dim = 32 inv_freq(%f : tensor<16xf32>) : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %tagged = attn.rope %q half theta = 10000.0 rotary_dim = 64 {note = "q"} : tensor<?x8x?x64xf16>
// CHECK-NEXT:    func.return
// CHECK-NEXT:  }

// CHECK-GENERIC:      "attn.rope"(%q) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xf16>
// CHECK-GENERIC:      "attn.rope"(%q) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 64 : i64, scaling = #attn.rope_scaling<linear, factor = 4.0>, operandSegmentSizes = array<i32: 1, 0, 0>}>
// CHECK-GENERIC:      "attn.rope"(%q, %f) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 32 : i64, operandSegmentSizes = array<i32: 1, 1, 0>}> : (tensor<?x8x?x64xf16>, tensor<16xf32>) -> tensor<?x8x?x64xf16>
// CHECK-GENERIC-NEXT: "attn.rope"(%q) <{style = #attn<rope_style half>, theta = 1.000000e+04 : f64, rotary_dim = 64 : i64, operandSegmentSizes = array<i32: 1, 0, 0>}> {note = "q"}
