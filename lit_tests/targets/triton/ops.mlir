// RUN: attnfuse-opt %s -t triton | filecheck %s
// RUN: attnfuse-opt %s -t triton > %t.py
// RUN: python -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" %t.py

// Each tl op's Python: operators for arithmetic, tl.* calls, constants inline, a loop
// with carried values, constexpr parameters annotated, the launcher's host code.

tl.kernel @ops(%x: !tl.ptr<f16>, %n: i32, %BLOCK: i32 constexpr) {
  %pid = tl.program_id 0 : i32
  %nprog = tl.num_programs 1 : i32
  %c2 = tl.constant 2 : i32
  %half = tl.constant 5.000000e-01 : f32
  %r = tl.arange %BLOCK : i32 -> !tl.tile<i32>
  %zeros = tl.full %BLOCK, %BLOCK value = 0.000000e+00 : f32 -> !tl.tile<f32>
  %neg_inf = tl.full %BLOCK value = 0xff800000 : f32 -> !tl.tile<f32>
  %add = tl.add %pid, %r : i32, !tl.tile<i32> -> !tl.tile<i32>
  %fdiv = tl.floordiv %add, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
  %rem = tl.rem %fdiv, %c2 : !tl.tile<i32>, i32 -> !tl.tile<i32>
  %cdiv = tl.cdiv %n, %c2 : i32, i32 -> i32
  %lt = tl.cmp "<" %rem, %cdiv : !tl.tile<i32>, i32 -> !tl.tile<i1>
  %not = tl.not %lt : !tl.tile<i1>
  %row = tl.expand_dims %r axis 1 : !tl.tile<i32>
  %col = tl.expand_dims %r axis 0 : !tl.tile<i32>
  %offs = tl.add %row, %col : !tl.tile<i32>, !tl.tile<i32> -> !tl.tile<i32>
  %ptrs = tl.add %x, %offs : !tl.ptr<f16>, !tl.tile<i32> -> !tl.tile<!tl.ptr<f16>>
  %mask = tl.expand_dims %not axis 1 : !tl.tile<i1>
  %a = tl.load %ptrs mask %mask : !tl.tile<i1> {other = 0.000000e+00 : f16} : !tl.tile<!tl.ptr<f16>> -> !tl.tile<f16>
  %at = tl.trans %a : !tl.tile<f16>
  %d = tl.dot %a, %at acc %zeros : !tl.tile<f32> {input_precision = "ieee"} : !tl.tile<f16>, !tl.tile<f16> -> !tl.tile<f32>
  %w = tl.where %mask, %d, %neg_inf : !tl.tile<i1>, !tl.tile<f32>, !tl.tile<f32> -> !tl.tile<f32>
  %m = tl.reduce max %w axis 1 : !tl.tile<f32>
  %e = tl.exp2 %m : !tl.tile<f32>
  %c0 = tl.constant 0 : i32
  %acc = tl.for %i = %c0 to %n step %BLOCK iter_args(%acc_i = %zeros) -> (!tl.tile<f32>) {
    %next = tl.mul %acc_i, %half : !tl.tile<f32>, f32 -> !tl.tile<f32>
    tl.yield %next : !tl.tile<f32>
  }
  %h = tl.cast %acc : !tl.tile<f32> -> !tl.tile<f16>
  tl.store %h, %ptrs mask %mask : !tl.tile<i1> : !tl.tile<f16>, !tl.tile<!tl.ptr<f16>>
  tl.return
}
tl.launcher "launch"(["x"]) {
  tl.alloc "out" shape ["x.shape[0]", "16"] dtype "torch.float16" device "x.device"
  tl.alloc "o4" shape ["x.shape[0]", "2", "x.shape[1]", "16"] dtype "torch.float16" device "x.device" order_of "x"
  tl.call "ops" grid ["triton.cdiv(x.shape[0], 16)", "1"] args ["x", "x.shape[0]", "16"] num_warps 4 num_stages 2
  tl.host_return ["out"]
}

// CHECK:       @triton.jit
// CHECK-NEXT:  def ops(x, n, BLOCK: tl.constexpr):
// CHECK-NEXT:      pid = tl.program_id(0)
// CHECK-NEXT:      nprog = tl.num_programs(1)
// CHECK-NEXT:      r = tl.arange(0, BLOCK)
// CHECK-NEXT:      zeros = tl.full([BLOCK, BLOCK], 0.0, tl.float32)
// CHECK-NEXT:      neg_inf = tl.full([BLOCK], float("-inf"), tl.float32)
// CHECK:           tl.cdiv(n, 2)
// CHECK:           tl.load({{.*}}, mask={{.*}}, other=0.0)
// CHECK:           tl.trans(
// CHECK:           tl.dot({{.*}}, zeros, input_precision="ieee")
// CHECK:           tl.where(
// CHECK:           tl.max({{.*}}, 1)
// CHECK:           tl.exp2(
// CHECK:           acc_i = zeros
// CHECK-NEXT:      for i in range(0, n, BLOCK):
// CHECK-NEXT:          next_ = acc_i * 0.5
// CHECK-NEXT:          acc_i = next_
// CHECK-NEXT:      h = acc_i.to(tl.float16)
// CHECK-NEXT:      tl.store(ptrs, h, mask=mask)
// CHECK:       def launch(x):
// CHECK-NEXT:      """Allocate the outputs and launch the kernels; returns out."""
// CHECK-NEXT:      x_shape, x_device = x.shape, x.device
// CHECK-NEXT:      out = torch.empty((x_shape[0], 16,), dtype=torch.float16, device=x_device)
// CHECK-NEXT:      o4 = _empty_ordered(x, (x_shape[0], 2, x_shape[1], 16,), torch.float16, x_device)
// CHECK-NEXT:      _launch(ops, (triton.cdiv(x_shape[0], 16), 1,), 4, 2,
// CHECK-NEXT:              x, x_shape[0], 16)
// CHECK-NEXT:      return out
// CHECK:       LAUNCH_PARAMS = {
// CHECK-NEXT:      'ops': {'grid': ['triton.cdiv(x.shape[0], 16)', '1'], 'num_warps': 4, 'num_stages': 2, 'constexprs': {'BLOCK': '16'}},
// CHECK-NEXT:  }
