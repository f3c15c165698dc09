// RUN: ATTN_VERIFY

// Broken attn.norm, attn.scale and attn.softcap ops, one per chunk.

func.func @norm_eps_zero(%q: tensor<?x8x?x64xf32>) {
  %n = attn.norm %q eps = 0.0 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.norm eps must be > 0 and finite, got 0.0

// -----

func.func @norm_eps_negative(%q: tensor<?x8x?x64xf32>) {
  %n = attn.norm %q eps = -1.0e-06 : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.norm eps must be > 0 and finite, got -1e-06

// -----

func.func @norm_eps_inf(%q: tensor<?x8x?x64xf32>) {
  %n = "attn.norm"(%q) <{eps = 0x7FF0000000000000 : f64}> : (tensor<?x8x?x64xf32>) -> tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.norm eps must be > 0 and finite, got inf

// -----

func.func @norm_weight_shape(%q: tensor<?x8x?x64xf32>, %w: tensor<8xf32>) {
  %n = attn.norm %q eps = 1.0e-06 weight(%w : tensor<8xf32>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.norm weight must be a float tensor<64x...> (the head dim), got tensor<8xf32>

// -----

func.func @norm_weight_int(%q: tensor<?x8x?x64xf32>, %w: tensor<64xi8>) {
  %n = attn.norm %q eps = 1.0e-06 weight(%w : tensor<64xi8>) : tensor<?x8x?x64xf32>
  func.return
}
// CHECK: attn.norm weight must be a float tensor<64x...> (the head dim), got tensor<64xi8>

// -----

func.func @norm_rank3(%q: tensor<8x?x64xf32>) {
  %n = attn.norm %q eps = 1.0e-06 : tensor<8x?x64xf32>
  func.return
}
// CHECK: attn.norm input must be a rank-4 tensor [B, H, N, D], got tensor<8x?x64xf32>

// -----

func.func @norm_result_type(%q: tensor<?x8x?x64xf32>) {
  %n = "attn.norm"(%q) <{eps = 1.0e-06 : f64}> : (tensor<?x8x?x64xf32>) -> tensor<?x4x?x64xf32>
  func.return
}
// CHECK:      "attn.norm"
// CHECK:      Operation does not verify: result 'output' at position 0 does not verify:
// CHECK-NEXT: attribute tensor<?x8x?x64xf32> expected from variable 'T', but got tensor<?x4x?x64xf32>

// -----

func.func @scale_probs(%s: !attn.scores<4>) {
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %x = "attn.scale"(%p) <{value = 2.0 : f64}> : (!attn.probs<4>) -> !attn.probs<4>
  func.return
}
// CHECK: attn.scale input must be a q/k tensor or !attn.scores, got !attn.probs<4>

// -----

func.func @scale_scalar(%x: f32) {
  %y = attn.scale %x value = 2.0 : f32
  func.return
}
// CHECK: attn.scale input must be a q/k tensor or !attn.scores, got f32

// -----

func.func @scale_rank3(%q: tensor<?x?x64xf16>) {
  %y = attn.scale %q value = 2.0 : tensor<?x?x64xf16>
  func.return
}
// CHECK: attn.scale input must be a rank-4 tensor [B, H, N, D], got tensor<?x?x64xf16>

// -----

func.func @scale_result_type(%s: !attn.scores<4>) {
  %x = "attn.scale"(%s) <{value = 2.0 : f64}> : (!attn.scores<4>) -> !attn.scores<8>
  func.return
}
// CHECK:      "attn.scale"
// CHECK:      Operation does not verify: result 'output' at position 0 does not verify:
// CHECK-NEXT: attribute !attn.scores<4> expected from variable 'T', but got !attn.scores<8>

// -----

func.func @scale_infinite(%s: !attn.scores<4>) {
  %x = "attn.scale"(%s) <{value = 0xFFF0000000000000 : f64}> : (!attn.scores<4>) -> !attn.scores<4>
  func.return
}
// CHECK: attn.scale value must be finite, got -inf

// -----

func.func @softcap_zero(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = 0.0 : !attn.scores<4>
  func.return
}
// CHECK: attn.softcap cap must be > 0 and finite, got 0.0

// -----

func.func @softcap_negative(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = -30.0 : !attn.scores<4>
  func.return
}
// CHECK: attn.softcap cap must be > 0 and finite, got -30.0

// -----

func.func @softcap_infinite(%s: !attn.scores<4>) {
  %c = "attn.softcap"(%s) <{cap = 0x7FF0000000000000 : f64}> : (!attn.scores<4>) -> !attn.scores<4>
  func.return
}
// CHECK: attn.softcap cap must be > 0 and finite, got inf

// -----

func.func @softcap_result_type(%s: !attn.scores<4>) {
  %c = "attn.softcap"(%s) <{cap = 30.0 : f64}> : (!attn.scores<4>) -> !attn.scores<2>
  func.return
}
// CHECK:      "attn.softcap"
// CHECK:      Operation does not verify: result 'output' at position 0 does not verify:
// CHECK-NEXT: attribute !attn.scores<4> expected from variable 'T', but got !attn.scores<2>

// -----

func.func @softcap_on_tensor(%q: tensor<?x8x?x64xf32>) {
  %c = "attn.softcap"(%q) <{cap = 30.0 : f64}> : (tensor<?x8x?x64xf32>) -> tensor<?x8x?x64xf32>
  func.return
}
// CHECK:      "attn.softcap"(%q)
// CHECK:      operand 'input' at position 0 does not verify:
// CHECK-NEXT: tensor<?x8x?x64xf32> should be of base attribute attn.scores
