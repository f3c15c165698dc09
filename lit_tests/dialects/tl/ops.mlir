// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// Every tl op, device and host, in its custom form; the printer gives back exactly
// this text, also after a trip through the generic form.

tl.kernel @all_ops(%x: !tl.ptr<f16>, %ids: !tl.ptr<i32>, %n: i32, %BLOCK: i32 constexpr) {
  %pid = tl.program_id 0 : i32
  %nprog = tl.num_programs 1 : i32
  %c2 = tl.constant 2 : i32
  %half = tl.constant 5.000000e-01 : f32
  %true = tl.constant true
  %r = tl.arange %BLOCK : i32 -> !tl.tile<i32>
  %zeros = tl.full %BLOCK, %BLOCK value = 0.000000e+00 : f32 -> !tl.tile<f32>
  %neg_inf = tl.full %BLOCK value = 0xff800000 : f32 -> !tl.tile<f32>
  %izeros = tl.full %BLOCK value = 7 : i32 -> !tl.tile<i32>
  %add = tl.add %pid, %r : i32, !tl.tile<i32> -> !tl.tile<i32>
  %sub = tl.sub %add, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
  %mul = tl.mul %sub, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
  %fdiv = tl.floordiv %mul, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
  %rem = tl.rem %fdiv, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
  %xor = tl.xor %rem, %izeros : !tl.tile<i32>, !tl.tile<i32> -> !tl.tile<i32>
  %max = tl.maximum %xor, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
  %min = tl.minimum %max, %n : !tl.tile<i32>, i32 -> !tl.tile<i32>
  %cdiv = tl.cdiv %n, %c2 : i32, i32 -> i32
  %lt = tl.cmp "<" %min, %n : !tl.tile<i32>, i32 -> !tl.tile<i1>
  %ge = tl.cmp ">=" %min, %cdiv : !tl.tile<i32>, i32 -> !tl.tile<i1>
  %and = tl.and %lt, %ge : !tl.tile<i1>, !tl.tile<i1> -> !tl.tile<i1>
  %or = tl.or %and, %true : !tl.tile<i1>, i1 -> !tl.tile<i1>
  %not = tl.not %or : !tl.tile<i1>
  %row = tl.expand_dims %r axis 1 : !tl.tile<i32>
  %col = tl.expand_dims %r axis 0 : !tl.tile<i32>
  %offs = tl.add %row, %col : !tl.tile<i32>, !tl.tile<i32> -> !tl.tile<i32>
  %ptrs = tl.add %x, %offs : !tl.ptr<f16>, !tl.tile<i32> -> !tl.tile<!tl.ptr<f16>>
  %a = tl.load %ptrs : !tl.tile<!tl.ptr<f16>> -> !tl.tile<f16>
  %m2 = tl.expand_dims %not axis 1 : !tl.tile<i1>
  %b = tl.load %ptrs mask %m2 : !tl.tile<i1> {other = 0.000000e+00 : f16} : !tl.tile<!tl.ptr<f16>> -> !tl.tile<f16>
  %id = tl.load %ids : !tl.ptr<i32> -> i32
  %bt = tl.trans %b : !tl.tile<f16>
  %g = tl.gather %b[%mul] axis 1 : !tl.tile<f16>, !tl.tile<i32>
  %d0 = tl.dot %a, %bt : !tl.tile<f16>, !tl.tile<f16> -> !tl.tile<f32>
  %d1 = tl.dot %a, %bt acc %d0 : !tl.tile<f32> {input_precision = "ieee"} : !tl.tile<f16>, !tl.tile<f16> -> !tl.tile<f32>
  %w = tl.where %m2, %d1, %half : !tl.tile<i1>, !tl.tile<f32>, f32 -> !tl.tile<f32>
  %e2 = tl.exp2 %w : !tl.tile<f32>
  %l2 = tl.log2 %e2 : !tl.tile<f32>
  %e = tl.exp %l2 : !tl.tile<f32>
  %l = tl.log %e : !tl.tile<f32>
  %sq = tl.sqrt %l : !tl.tile<f32>
  %rs = tl.rsqrt %sq : !tl.tile<f32>
  %cos = tl.cos %rs : !tl.tile<f32>
  %sin = tl.sin %cos : !tl.tile<f32>
  %abs = tl.abs %sin : !tl.tile<f32>
  %sig = tl.sigmoid %abs : !tl.tile<f32>
  %ftanh = tl.fast_tanh %sig : !tl.tile<f32>
  %neg = tl.neg %sig : !tl.tile<f32>
  %div = tl.truediv %neg, %half : !tl.tile<f32>, f32 -> !tl.tile<f32>
  %rmax = tl.reduce max %div axis 1 : !tl.tile<f32>
  %rsum = tl.reduce sum %div axis 0 : !tl.tile<f32>
  %c0 = tl.constant 0 : i32
  %acc, %best = tl.for %i = %c0 to %n step %BLOCK iter_args(%acc_i = %zeros, %best_i = %rmax) -> (!tl.tile<f32>, !tl.tile<f32>) {
    %ia = tl.add %acc_i, %half : !tl.tile<f32>, f32 -> !tl.tile<f32>
    %ib = tl.maximum %best_i, %rsum : !tl.tile<f32>, !tl.tile<f32> -> !tl.tile<f32>
    tl.yield %ia, %ib : !tl.tile<f32>, !tl.tile<f32>
  }
  tl.for %j = %c0 to %n step %c2 {
    tl.yield
  }
  %h = tl.cast %acc : !tl.tile<f32> -> !tl.tile<f16>
  %hi = tl.cast %id : i32 -> f32
  tl.store %h, %ptrs mask %m2 : !tl.tile<i1> : !tl.tile<f16>, !tl.tile<!tl.ptr<f16>>
  tl.store %h, %ptrs : !tl.tile<f16>, !tl.tile<!tl.ptr<f16>>
  tl.return
}
tl.device_fn @score(%s: !tl.tile<f32>, %qi: !tl.tile<i32>, %ki: !tl.tile<i32>, %off: i32, %t: !tl.ptr<f32>) {
  %keep = tl.cmp "<=" %ki, %qi : !tl.tile<i32>, !tl.tile<i32> -> !tl.tile<i1>
  %w = tl.load %t : !tl.ptr<f32> -> f32
  %sw = tl.mul %s, %w : !tl.tile<f32>, f32 -> !tl.tile<f32>
  tl.return %sw, %keep : !tl.tile<f32>, !tl.tile<i1>
}
tl.launcher "launch"(["x", "ids"]) {
  tl.alloc "out" shape ["x.shape[0]", "16"] dtype "torch.float16" device "x.device"
  tl.alloc "ws" shape ["x.shape[0]"] dtype "torch.float32" device "x.device" given
  tl.alloc "o4" shape ["x.shape[0]", "4", "x.shape[2]", "16"] dtype "torch.float16" device "x.device" order_of "x"
  tl.rope_table "t_cos", "t_sin" inv_freq [1.000000e+00 : f32, 1.000000e-01 : f32] length "max(x.shape[0], 4)" magnitude 1.250000e+00 device "x.device"
  tl.freq_table "t_freq" inv_freq [1.000000e+00 : f32, 1.000000e-01 : f32] device "x.device"
  tl.hadamard_table "t_had" d 64 seed 3 device "x.device"
  tl.call "all_ops" grid ["triton.cdiv(x.shape[0], 16)", "1"] args ["x", "ids", "x.shape[0]", "16"] num_warps 4 num_stages 2
  tl.host_sum "total" = "out" dims [0 : i64] dtype "torch.float32"
  tl.decode_splits "splits", "split_keys" rows "x.shape[0] * 2" length "ids.shape[1] * 16" block_n 64 waves 2 min_keys 256 fixed 0 device "x.device"
  tl.host_assign "rows" = "max(16, x.shape[0])"
  tl.host_if "_gluon_fits(x, x, x, 2048)" {
    tl.gluon_attention "x", "x", "x" -> "out", "ws" scale 1.250000e-01 causal
    tl.gluon_attention "x", "x", "x" -> "out", "ws" scale 1.250000e-01 sink "ids" range @score score @score masked @score natural args ["x", "x.stride(0)"]
    tl.gluon_attention "x", "x", "x" -> "out", "ws" scale 1.250000e-01 causal fp8 ["ws", "ws", "ws", "128", "0"]
    tl.gluon_backward "x", "x", "x", "out", "ws", "ws" -> "ws", "x", "x" scale 1.250000e-01 range @score kv_range @score full @score masked @score
    tl.gluon_backward "x", "x", "x", "out", "ws", "ws" -> "ws", "x", "x" scale 1.250000e-01 range @score kv_range @score full @score masked @score reduce_dq "not _gl_deterministic()" args ["ids"]
    tl.gluon_backward "x", "x", "x", "out", "ws", "ws" -> "ws", "x", "x" scale 1.250000e-01 range @score kv_range @score full @score masked @score k_rope ["cos", "sin", "0"]
    tl.gluon_backward "x", "x", "x", "out", "ws", "ws" -> "ws", "x", "x" scale 1.250000e-01 range @score kv_range @score full @score masked @score k_rope ["cos", "sin", "0"] apply_k_rope
  } else {
    tl.call "all_ops" grid ["1", "1"] args ["x", "ids", "x.shape[0]", "16"] num_warps 4 num_stages 2
  }
  tl.host_return ["out"]
}

// CHECK:      builtin.module {
// CHECK-NEXT:   tl.kernel @all_ops(%x: !tl.ptr<f16>, %ids: !tl.ptr<i32>, %n: i32, %BLOCK: i32 constexpr) {
// CHECK-NEXT:     %pid = tl.program_id 0 : i32
// CHECK-NEXT:     %nprog = tl.num_programs 1 : i32
// CHECK-NEXT:     %c2 = tl.constant 2 : i32
// CHECK-NEXT:     %half = tl.constant 5.000000e-01 : f32
// CHECK-NEXT:     %true = tl.constant true
// CHECK-NEXT:     %r = tl.arange %BLOCK : i32 -> !tl.tile<i32>
// CHECK-NEXT:     %zeros = tl.full %BLOCK, %BLOCK value = 0.000000e+00 : f32 -> !tl.tile<f32>
// CHECK-NEXT:     %neg_inf = tl.full %BLOCK value = 0xff800000 : f32 -> !tl.tile<f32>
// CHECK-NEXT:     %izeros = tl.full %BLOCK value = 7 : i32 -> !tl.tile<i32>
// CHECK-NEXT:     %add = tl.add %pid, %r : i32, !tl.tile<i32> -> !tl.tile<i32>
// CHECK-NEXT:     %sub = tl.sub %add, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
// CHECK-NEXT:     %mul = tl.mul %sub, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
// CHECK-NEXT:     %fdiv = tl.floordiv %mul, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
// CHECK-NEXT:     %rem = tl.rem %fdiv, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
// CHECK-NEXT:     %xor = tl.xor %rem, %izeros : !tl.tile<i32>, !tl.tile<i32> -> !tl.tile<i32>
// CHECK-NEXT:     %max = tl.maximum %xor, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
// CHECK-NEXT:     %min = tl.minimum %max, %n : !tl.tile<i32>, i32 -> !tl.tile<i32>
// CHECK-NEXT:     %cdiv = tl.cdiv %n, %c2 : i32, i32 -> i32
// CHECK-NEXT:     %lt = tl.cmp "<" %min, %n : !tl.tile<i32>, i32 -> !tl.tile<i1>
// CHECK-NEXT:     %ge = tl.cmp ">=" %min, %cdiv : !tl.tile<i32>, i32 -> !tl.tile<i1>
// CHECK-NEXT:     %and = tl.and %lt, %ge : !tl.tile<i1>, !tl.tile<i1> -> !tl.tile<i1>
// CHECK-NEXT:     %or = tl.or %and, %true : !tl.tile<i1>, i1 -> !tl.tile<i1>
// CHECK-NEXT:     %not = tl.not %or : !tl.tile<i1>
// CHECK-NEXT:     %row = tl.expand_dims %r axis 1 : !tl.tile<i32>
// CHECK-NEXT:     %col = tl.expand_dims %r axis 0 : !tl.tile<i32>
// CHECK-NEXT:     %offs = tl.add %row, %col : !tl.tile<i32>, !tl.tile<i32> -> !tl.tile<i32>
// CHECK-NEXT:     %ptrs = tl.add %x, %offs : !tl.ptr<f16>, !tl.tile<i32> -> !tl.tile<!tl.ptr<f16>>
// CHECK-NEXT:     %a = tl.load %ptrs : !tl.tile<!tl.ptr<f16>> -> !tl.tile<f16>
// CHECK-NEXT:     %m2 = tl.expand_dims %not axis 1 : !tl.tile<i1>
// CHECK-NEXT:     %b = tl.load %ptrs mask %m2 : !tl.tile<i1> {other = 0.000000e+00 : f16} : !tl.tile<!tl.ptr<f16>> -> !tl.tile<f16>
// CHECK-NEXT:     %id = tl.load %ids : !tl.ptr<i32> -> i32
// CHECK-NEXT:     %bt = tl.trans %b : !tl.tile<f16>
// CHECK-NEXT:     %g = tl.gather %b[%mul] axis 1 : !tl.tile<f16>, !tl.tile<i32>
// CHECK-NEXT:     %d0 = tl.dot %a, %bt : !tl.tile<f16>, !tl.tile<f16> -> !tl.tile<f32>
// CHECK-NEXT:     %d1 = tl.dot %a, %bt acc %d0 : !tl.tile<f32> {input_precision = "ieee"} : !tl.tile<f16>, !tl.tile<f16> -> !tl.tile<f32>
// CHECK-NEXT:     %w = tl.where %m2, %d1, %half : !tl.tile<i1>, !tl.tile<f32>, f32 -> !tl.tile<f32>
// CHECK-NEXT:     %e2 = tl.exp2 %w : !tl.tile<f32>
// CHECK-NEXT:     %l2 = tl.log2 %e2 : !tl.tile<f32>
// CHECK-NEXT:     %e = tl.exp %l2 : !tl.tile<f32>
// CHECK-NEXT:     %l = tl.log %e : !tl.tile<f32>
// CHECK-NEXT:     %sq = tl.sqrt %l : !tl.tile<f32>
// CHECK-NEXT:     %rs = tl.rsqrt %sq : !tl.tile<f32>
// CHECK-NEXT:     %cos = tl.cos %rs : !tl.tile<f32>
// CHECK-NEXT:     %sin = tl.sin %cos : !tl.tile<f32>
// CHECK-NEXT:     %abs = tl.abs %sin : !tl.tile<f32>
// CHECK-NEXT:     %sig = tl.sigmoid %abs : !tl.tile<f32>
// CHECK-NEXT:     %ftanh = tl.fast_tanh %sig : !tl.tile<f32>
// CHECK-NEXT:     %neg = tl.neg %sig : !tl.tile<f32>
// CHECK-NEXT:     %div = tl.truediv %neg, %half : !tl.tile<f32>, f32 -> !tl.tile<f32>
// CHECK-NEXT:     %rmax = tl.reduce max %div axis 1 : !tl.tile<f32>
// CHECK-NEXT:     %rsum = tl.reduce sum %div axis 0 : !tl.tile<f32>
// CHECK-NEXT:     %c0 = tl.constant 0 : i32
// CHECK-NEXT:     %acc, %best = tl.for %i = %c0 to %n step %BLOCK iter_args(%acc_i = %zeros, %best_i = %rmax) -> (!tl.tile<f32>, !tl.tile<f32>) {
// CHECK-NEXT:       %ia = tl.add %acc_i, %half : !tl.tile<f32>, f32 -> !tl.tile<f32>
// CHECK-NEXT:       %ib = tl.maximum %best_i, %rsum : !tl.tile<f32>, !tl.tile<f32> -> !tl.tile<f32>
// CHECK-NEXT:       tl.yield %ia, %ib : !tl.tile<f32>, !tl.tile<f32>
// CHECK-NEXT:     }
// CHECK-NEXT:     tl.for %j = %c0 to %n step %c2 {
// CHECK-NEXT:       tl.yield
// CHECK-NEXT:     }
// CHECK-NEXT:     %h = tl.cast %acc : !tl.tile<f32> -> !tl.tile<f16>
// CHECK-NEXT:     %hi = tl.cast %id : i32 -> f32
// CHECK-NEXT:     tl.store %h, %ptrs mask %m2 : !tl.tile<i1> : !tl.tile<f16>, !tl.tile<!tl.ptr<f16>>
// CHECK-NEXT:     tl.store %h, %ptrs : !tl.tile<f16>, !tl.tile<!tl.ptr<f16>>
// CHECK-NEXT:     tl.return
// CHECK-NEXT:   }
// CHECK-NEXT:   tl.device_fn @score(%s: !tl.tile<f32>, %qi: !tl.tile<i32>, %ki: !tl.tile<i32>, %off: i32, %t: !tl.ptr<f32>) {
// CHECK-NEXT:     %keep = tl.cmp "<=" %ki, %qi : !tl.tile<i32>, !tl.tile<i32> -> !tl.tile<i1>
// CHECK-NEXT:     %w = tl.load %t : !tl.ptr<f32> -> f32
// CHECK-NEXT:     %sw = tl.mul %s, %w : !tl.tile<f32>, f32 -> !tl.tile<f32>
// CHECK-NEXT:     tl.return %sw, %keep : !tl.tile<f32>, !tl.tile<i1>
// CHECK-NEXT:   }
// CHECK-NEXT:   tl.launcher "launch"(["x", "ids"]) {
// CHECK-NEXT:     tl.alloc "out" shape ["x.shape[0]", "16"] dtype "torch.float16" device "x.device"
// CHECK-NEXT:     tl.alloc "ws" shape ["x.shape[0]"] dtype "torch.float32" device "x.device" given
// CHECK-NEXT:     tl.alloc "o4" shape ["x.shape[0]", "4", "x.shape[2]", "16"] dtype "torch.float16" device "x.device" order_of "x"
// CHECK-NEXT:     tl.rope_table "t_cos", "t_sin" inv_freq [1.000000e+00 : f32, 1.000000e-01 : f32] length "max(x.shape[0], 4)" magnitude 1.250000e+00 device "x.device"
// CHECK-NEXT:     tl.freq_table "t_freq" inv_freq [1.000000e+00 : f32, 1.000000e-01 : f32] device "x.device"
// CHECK-NEXT:     tl.hadamard_table "t_had" d 64 seed 3 device "x.device"
// CHECK-NEXT:     tl.call "all_ops" grid ["triton.cdiv(x.shape[0], 16)", "1"] args ["x", "ids", "x.shape[0]", "16"] num_warps 4 num_stages 2
// CHECK-NEXT:     tl.host_sum "total" = "out" dims [0 : i64] dtype "torch.float32"
// CHECK-NEXT:     tl.decode_splits "splits", "split_keys" rows "x.shape[0] * 2" length "ids.shape[1] * 16" block_n 64 waves 2 min_keys 256 fixed 0 device "x.device"
// CHECK-NEXT:     tl.host_assign "rows" = "max(16, x.shape[0])"
// CHECK-NEXT:     tl.host_if "_gluon_fits(x, x, x, 2048)" {
// CHECK-NEXT:       tl.gluon_attention "x", "x", "x" -> "out", "ws" scale 1.250000e-01 causal
// CHECK-NEXT:       tl.gluon_attention "x", "x", "x" -> "out", "ws" scale 1.250000e-01 sink "ids" range @score score @score masked @score natural args ["x", "x.stride(0)"]
// CHECK-NEXT:       tl.gluon_attention "x", "x", "x" -> "out", "ws" scale 1.250000e-01 causal fp8 ["ws", "ws", "ws", "128", "0"]
// CHECK-NEXT:       tl.gluon_backward "x", "x", "x", "out", "ws", "ws" -> "ws", "x", "x" scale 1.250000e-01 range @score kv_range @score full @score masked @score
// CHECK-NEXT:       tl.gluon_backward "x", "x", "x", "out", "ws", "ws" -> "ws", "x", "x" scale 1.250000e-01 range @score kv_range @score full @score masked @score reduce_dq "not _gl_deterministic()" args ["ids"]
// CHECK-NEXT:       tl.gluon_backward "x", "x", "x", "out", "ws", "ws" -> "ws", "x", "x" scale 1.250000e-01 range @score kv_range @score full @score masked @score k_rope ["cos", "sin", "0"]
// CHECK-NEXT:       tl.gluon_backward "x", "x", "x", "out", "ws", "ws" -> "ws", "x", "x" scale 1.250000e-01 range @score kv_range @score full @score masked @score k_rope ["cos", "sin", "0"] apply_k_rope
// CHECK-NEXT:     } else {
// CHECK-NEXT:       tl.call "all_ops" grid ["1", "1"] args ["x", "ids", "x.shape[0]", "16"] num_warps 4 num_stages 2
// CHECK-NEXT:     }
// CHECK-NEXT:     tl.host_return ["out"]
// CHECK-NEXT:   }
// CHECK-NEXT: }

// The generic form: properties, regions and block arguments spelled out.
// CHECK-GENERIC:      "tl.kernel"() <{sym_name = "all_ops", constexprs = [#builtin.int<3>]}> ({
// CHECK-GENERIC-NEXT: ^bb0(%x: !tl.ptr<f16>, %ids: !tl.ptr<i32>, %n: i32, %BLOCK: i32):
// CHECK-GENERIC-NEXT:   %pid = "tl.program_id"() <{axis = 0 : i64}> : () -> i32
// CHECK-GENERIC-NEXT:   %nprog = "tl.num_programs"() <{axis = 1 : i64}> : () -> i32
// CHECK-GENERIC:        %lt = "tl.cmp"(%min, %n) <{predicate = #tl<cmp_predicate "<">}> : (!tl.tile<i32>, i32) -> !tl.tile<i1>
// CHECK-GENERIC:        %b = "tl.load"(%ptrs, %m2) <{other = 0.000000e+00 : f16}> : (!tl.tile<!tl.ptr<f16>>, !tl.tile<i1>) -> !tl.tile<f16>
// CHECK-GENERIC:        %acc, %best = "tl.for"(%c0, %n, %BLOCK, %zeros, %rmax) ({
// CHECK-GENERIC-NEXT:   ^bb0(%i: i32, %acc_i: !tl.tile<f32>, %best_i: !tl.tile<f32>):
// CHECK-GENERIC:          "tl.yield"(%ia, %ib) : (!tl.tile<f32>, !tl.tile<f32>) -> ()
// CHECK-GENERIC:        "tl.return"() : () -> ()
// CHECK-GENERIC:      "tl.device_fn"() <{sym_name = "score"}> ({
// CHECK-GENERIC-NEXT: ^bb{{[0-9]+}}(%s: !tl.tile<f32>, %qi: !tl.tile<i32>, %ki: !tl.tile<i32>, %off: i32, %t: !tl.ptr<f32>):
// CHECK-GENERIC:        "tl.return"(%sw, %keep) : (!tl.tile<f32>, !tl.tile<i1>) -> ()
// CHECK-GENERIC:      "tl.launcher"() <{sym_name = "launch", params = ["x", "ids"]}> ({
// CHECK-GENERIC-NEXT:   "tl.alloc"() <{var = "out", shape = ["x.shape[0]", "16"], dtype = "torch.float16", device = "x.device"}> : () -> ()
// CHECK-GENERIC-NEXT:   "tl.alloc"() <{var = "ws", shape = ["x.shape[0]"], dtype = "torch.float32", device = "x.device", given}> : () -> ()
// CHECK-GENERIC-NEXT:   "tl.alloc"() <{var = "o4", shape = ["x.shape[0]", "4", "x.shape[2]", "16"], dtype = "torch.float16", device = "x.device", order_of = "x"}> : () -> ()
// CHECK-GENERIC:        "tl.host_if"() <{cond = "_gluon_fits(x, x, x, 2048)"}> ({
// CHECK-GENERIC-NEXT:     "tl.gluon_attention"() <{q = "x", k = "x", v = "x", out = "out", lse = "ws", qk_scale = 1.250000e-01 : f64, causal}> : () -> ()
// CHECK-GENERIC-NEXT:     "tl.gluon_attention"() <{q = "x", k = "x", v = "x", out = "out", lse = "ws", qk_scale = 1.250000e-01 : f64, sink = "ids", range_fn = @score, score_full = @score, score_masked = @score, natural, args = ["x", "x.stride(0)"]}> : () -> ()
// CHECK-GENERIC-NEXT:     "tl.gluon_attention"() <{q = "x", k = "x", v = "x", out = "out", lse = "ws", qk_scale = 1.250000e-01 : f64, causal, fp8 = ["ws", "ws", "ws", "128", "0"]}> : () -> ()
// CHECK-GENERIC-NEXT:     "tl.gluon_backward"() <{q = "x", k = "x", v = "x", dout = "out", lse = "ws", delta = "ws", dq_acc = "ws", dk = "x", dv = "x", dk_scale = 1.250000e-01 : f64, range_fn = @score, kv_range_fn = @score, full = @score, masked = @score}> : () -> ()
// CHECK-GENERIC-NEXT:     "tl.gluon_backward"() <{q = "x", k = "x", v = "x", dout = "out", lse = "ws", delta = "ws", dq_acc = "ws", dk = "x", dv = "x", dk_scale = 1.250000e-01 : f64, range_fn = @score, kv_range_fn = @score, full = @score, masked = @score, reduce_dq = "not _gl_deterministic()", args = ["ids"]}> : () -> ()
// CHECK-GENERIC-NEXT:     "tl.gluon_backward"() <{q = "x", k = "x", v = "x", dout = "out", lse = "ws", delta = "ws", dq_acc = "ws", dk = "x", dv = "x", dk_scale = 1.250000e-01 : f64, range_fn = @score, kv_range_fn = @score, full = @score, masked = @score, k_rope = ["cos", "sin", "0"]}> : () -> ()
// CHECK-GENERIC-NEXT:     "tl.gluon_backward"() <{q = "x", k = "x", v = "x", dout = "out", lse = "ws", delta = "ws", dq_acc = "ws", dk = "x", dv = "x", dk_scale = 1.250000e-01 : f64, range_fn = @score, kv_range_fn = @score, full = @score, masked = @score, k_rope = ["cos", "sin", "0"], apply_k_rope}> : () -> ()
// CHECK-GENERIC-NEXT:   }, {
