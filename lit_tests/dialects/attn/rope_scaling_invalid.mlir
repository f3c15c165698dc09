// RUN: ATTN_VERIFY

// Broken #attn.rope_scaling attributes, one per chunk.

func.func @unknown_kind(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<ntk, factor = 2.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: unknown rope scaling 'ntk', expected one of linear, llama3, yarn

// -----

func.func @unknown_parameter(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<linear, factor = 2.0, beta_fast = 32.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling 'linear' has no parameter 'beta_fast', expected factor

// -----

func.func @linear_without_factor(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<linear> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling 'linear' needs parameter 'factor'

// -----

func.func @yarn_without_original_max_position(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 4.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling 'yarn' needs parameter 'original_max_position'

// -----

func.func @factor_zero(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<linear, factor = 0.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling factor must be > 0, got 0.0

// -----

func.func @factor_negative(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = -8.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling factor must be > 0, got -8.0

// -----

func.func @llama3_band_reversed(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0, low_freq_factor = 4.0, high_freq_factor = 1.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: llama3 rope scaling needs high_freq_factor > low_freq_factor > 0

// -----

func.func @llama3_low_zero(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0, low_freq_factor = 0.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: llama3 rope scaling needs high_freq_factor > low_freq_factor > 0

// -----

func.func @original_max_position_zero(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 4.0, original_max_position = 0.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling original_max_position must be > 0

// -----

func.func @llama3_original_max_position_negative(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<llama3, factor = 8.0, original_max_position = -1.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling original_max_position must be > 0

// -----

func.func @yarn_truncate_not_a_flag(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 4.0, original_max_position = 4096.0, truncate = 1.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling parameter 'truncate' must be true or false

// -----

func.func @factor_not_a_number(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<linear, factor = true> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling parameter 'factor' must be a float

// -----

func.func @factor_not_finite(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<linear, factor = 1.0e400> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: rope scaling parameter 'factor' must be finite, got inf

// -----

func.func @yarn_beta_negative(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 10000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 4.0, original_max_position = 4096.0, beta_slow = -1.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: yarn rope scaling needs beta_fast > 0, beta_slow > 0 and attention_factor >= 0

// -----

// YaRN's correction range divides by ln(theta).
func.func @yarn_theta_one(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta = 1.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 4.0, original_max_position = 4096.0> : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.rope with yarn scaling needs theta > 1, got 1.0
