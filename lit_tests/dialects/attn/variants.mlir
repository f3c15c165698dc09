// RUN: attnfuse-opt %s --split-input-file | filecheck %s
// RUN: ATTN_ROUNDTRIP

// Whole attention variants as published models use them, composed from the ten
// blocks; each survives the custom -> generic -> custom round trip unchanged.

// Llama 3: RoPE with llama3 scaling on q and k, GQA 32/8, causal.
func.func @llama3(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = 128 scaling = #attn.rope_scaling<llama3, factor = 8.0> : tensor<?x32x?x128xbf16>
  %kr = attn.rope %k half theta = 500000.0 rotary_dim = 128 scaling = #attn.rope_scaling<llama3, factor = 8.0> : tensor<?x8x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<32>
  %m = attn.mask %s causal : !attn.scores<32>
  %p = attn.softmax %m : !attn.scores<32> -> !attn.probs<32>
  %o = attn.pv %p, %v : !attn.probs<32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}

// CHECK-LABEL: func.func @llama3(
// CHECK-NEXT:    %qr = attn.rope %q half theta = 500000.0 rotary_dim = 128 scaling = #attn.rope_scaling<llama3, factor = 8.0> : tensor<?x32x?x128xbf16>
// CHECK-NEXT:    %kr = attn.rope %k half theta = 500000.0 rotary_dim = 128 scaling = #attn.rope_scaling<llama3, factor = 8.0> : tensor<?x8x?x128xbf16>
// CHECK-NEXT:    %s = attn.qk %qr, %kr : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<32>
// CHECK-NEXT:    %m = attn.mask %s causal : !attn.scores<32>
// CHECK-NEXT:    %p = attn.softmax %m : !attn.scores<32> -> !attn.probs<32>
// CHECK-NEXT:    %o = attn.pv %p, %v : !attn.probs<32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
// CHECK-NEXT:    func.return %o : tensor<?x32x?x128xbf16>

// -----

// Gemma 2 (local layer): query scale 1/sqrt(256) given explicitly, softcap 50,
// sliding window 4096.
func.func @gemma2(%q: tensor<?x8x?x256xf16>, %k: tensor<?x4x?x256xf16>, %v: tensor<?x4x?x256xf16>) -> tensor<?x8x?x256xf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 256 : tensor<?x8x?x256xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 256 : tensor<?x4x?x256xf16>
  %s = attn.qk %qr, %kr scale = 0.0625 : tensor<?x8x?x256xf16>, tensor<?x4x?x256xf16> -> !attn.scores<8>
  %c = attn.softcap %s cap = 50.0 : !attn.scores<8>
  %m = attn.mask %c sliding_window(4096) : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x4x?x256xf16> -> tensor<?x8x?x256xf16>
  func.return %o : tensor<?x8x?x256xf16>
}

// CHECK-LABEL: func.func @gemma2(
// CHECK:         %s = attn.qk %qr, %kr scale = 0.0625 : tensor<?x8x?x256xf16>, tensor<?x4x?x256xf16> -> !attn.scores<8>
// CHECK-NEXT:    %c = attn.softcap %s cap = 50.0 : !attn.scores<8>
// CHECK-NEXT:    %m = attn.mask %c sliding_window(4096) : !attn.scores<8>
// CHECK-NEXT:    %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>

// -----

// Qwen3: QK-norm with learned weights before RoPE.
func.func @qwen3(%q: tensor<?x16x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>, %qw: tensor<128xbf16>, %kw: tensor<128xbf16>) -> tensor<?x16x?x128xbf16> {
  %qn = attn.norm %q eps = 1.0e-06 weight(%qw : tensor<128xbf16>) : tensor<?x16x?x128xbf16>
  %kn = attn.norm %k eps = 1.0e-06 weight(%kw : tensor<128xbf16>) : tensor<?x8x?x128xbf16>
  %qr = attn.rope %qn half theta = 1000000.0 rotary_dim = 128 : tensor<?x16x?x128xbf16>
  %kr = attn.rope %kn half theta = 1000000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x16x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<16>
  %m = attn.mask %s causal : !attn.scores<16>
  %p = attn.softmax %m : !attn.scores<16> -> !attn.probs<16>
  %o = attn.pv %p, %v : !attn.probs<16>, tensor<?x8x?x128xbf16> -> tensor<?x16x?x128xbf16>
  func.return %o : tensor<?x16x?x128xbf16>
}

// CHECK-LABEL: func.func @qwen3(
// CHECK-NEXT:    %qn = attn.norm %q eps = 1.0e-06 weight(%qw : tensor<128xbf16>) : tensor<?x16x?x128xbf16>
// CHECK-NEXT:    %kn = attn.norm %k eps = 1.0e-06 weight(%kw : tensor<128xbf16>) : tensor<?x8x?x128xbf16>
// CHECK-NEXT:    %qr = attn.rope %qn half theta = 1000000.0 rotary_dim = 128 : tensor<?x16x?x128xbf16>

// -----

// gpt-oss: YaRN-scaled RoPE, sliding window 128, a learned sink logit per head.
func.func @gpt_oss(%q: tensor<?x64x?x64xbf16>, %k: tensor<?x8x?x64xbf16>, %v: tensor<?x8x?x64xbf16>, %sink: tensor<64xf32>) -> tensor<?x64x?x64xbf16> {
  %qr = attn.rope %q half theta = 150000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 32.0, original_max_position = 4096.0, truncate = false> : tensor<?x64x?x64xbf16>
  %kr = attn.rope %k half theta = 150000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 32.0, original_max_position = 4096.0, truncate = false> : tensor<?x8x?x64xbf16>
  %s = attn.qk %qr, %kr : tensor<?x64x?x64xbf16>, tensor<?x8x?x64xbf16> -> !attn.scores<64>
  %m = attn.mask %s sliding_window(128) : !attn.scores<64>
  %p = attn.softmax %m sink(%sink : tensor<64xf32>) : !attn.scores<64> -> !attn.probs<64>
  %o = attn.pv %p, %v : !attn.probs<64>, tensor<?x8x?x64xbf16> -> tensor<?x64x?x64xbf16>
  func.return %o : tensor<?x64x?x64xbf16>
}

// CHECK-LABEL: func.func @gpt_oss(
// CHECK-NEXT:    %qr = attn.rope %q half theta = 150000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 32.0, original_max_position = 4096.0, truncate = false> : tensor<?x64x?x64xbf16>
// CHECK:         %m = attn.mask %s sliding_window(128) : !attn.scores<64>
// CHECK-NEXT:    %p = attn.softmax %m sink(%sink : tensor<64xf32>) : !attn.scores<64> -> !attn.probs<64>

// -----

// MPT / BLOOM style: no RoPE, ALiBi bias, causal.
func.func @alibi(%q: tensor<?x16x?x64xf16>, %k: tensor<?x16x?x64xf16>, %v: tensor<?x16x?x64xf16>, %slopes: tensor<16xf32>) -> tensor<?x16x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x16x?x64xf16>, tensor<?x16x?x64xf16> -> !attn.scores<16>
  %b = attn.bias %s alibi(%slopes : tensor<16xf32>) : !attn.scores<16>
  %m = attn.mask %b causal : !attn.scores<16>
  %p = attn.softmax %m : !attn.scores<16> -> !attn.probs<16>
  %o = attn.pv %p, %v : !attn.probs<16>, tensor<?x16x?x64xf16> -> tensor<?x16x?x64xf16>
  func.return %o : tensor<?x16x?x64xf16>
}

// CHECK-LABEL: func.func @alibi(
// CHECK-NEXT:    %s = attn.qk %q, %k : tensor<?x16x?x64xf16>, tensor<?x16x?x64xf16> -> !attn.scores<16>
// CHECK-NEXT:    %b = attn.bias %s alibi(%slopes : tensor<16xf32>) : !attn.scores<16>
// CHECK-NEXT:    %m = attn.mask %b causal : !attn.scores<16>
