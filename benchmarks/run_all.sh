#!/usr/bin/env bash
# The whole GPU run in one device call: GPU tests, forward benchmark, tile sweep and
# Rotation Calculus check, each under its own time limit, all inside TOTAL_S seconds.
#
# Usage, from the repository root on the GPU machine (after installing the wheels and
# the project, see benchmarks/README.md):
#
#   bash benchmarks/run_all.sh [STEP ...]
#
# Steps, run in the order given (default: tests quick sweep):
#   tests     pytest -m gpu python_tests: every GPU-marked test (test_gpu.py, test_variants.py...),
#             8 xdist workers when xdist is installed
#   quick     bench_forward.py --quick  (causal, rope_causal; N 1024, 4096, 16384)
#   forward   bench_forward.py          (every variant and N; needs ~8 minutes alone)
#   sweep     sweep_tiles.py            (tile sweep, then fused vs prerotate per N)
#   tiles     sweep_tiles.py --part tiles
#   rotation  sweep_tiles.py --part rotation
#   ablation  ablation.py               (Table 3: plain causal, paper and Llama shapes, N 1024..16384)
#   hf        bench_hf.py               (Hugging Face: Llama-3-8B / Qwen3-8B training step, generate(),
#             loss curves; AttnFuse via apply() vs SDPA cuDNN/flash and flex)
#   backward  bench_backward.py         (training: fwd+bwd, bwd alone, peak memory vs rope+cuDNN/flex;
#             both shapes, N 1024..16384, ~5 minutes: best as the only step; split it with
#             EXTRA_BACKWARD_ARGS="--shapes llama" and "--shapes paper" in two calls if needed)
#   host      host_path.py              (host time per cache-hit call at N 128 / 512 vs SDPA, the CUDA-graph
#             floor, a profile; ~1 minute)
#   gluon     gluon/attention_sm90.py   (the hand-written Gluon kernels v1-v4 vs cuDNN / flash, each in a
#             supervised subprocess; ~2-4 minutes)
#   gluonbwd  gluon/backward_ab.py      (the sm90 Gluon backward vs the generic one, same module, and with its
#             ordered dQ kernel; Llama and paper shapes, N 4096 and 16384; ~2-3 minutes)
#   tanh      tanh_approx.py            (the generic kernel's softcap, tanh=approx vs tanh=exact, forward and
#             backward, three shapes, N 2048..8192, errors against float32; ~2-4 minutes, not yet run)
#   cptests   pytest -m gpu python_tests/test_distributed_gpu.py (2 GPUs, NCCL: context parallelism's
#             sharded output and gradients against the full sequence; ~1 minute)
#   cp        torchrun --nproc-per-node 2 bench_cp.py (2 GPUs: one Llama-3-8B attention layer fwd+bwd at
#             N 32k, 64k, 128k, AttnFuse CP vs torch's context_parallel with SDPA cuDNN / flash, and the
#             1-GPU rows for scaling efficiency; ~3 minutes)
#   fsdp      torchrun --nproc-per-node 2 train_fsdp.py (2 GPUs: Llama-3-8B FSDP2 training step, AttnFuse
#             via apply() vs SDPA cuDNN, 20-step loss curves; ~3 minutes; EXTRA_FSDP_ARGS="--compile" for
#             the compiled layers, best in a call of its own)
#   The 2-GPU steps need the nvidia-h200-x2 machine; run them in a call of their own.
#
# Environment: OUT (required: where results go), TOTAL_S (default 540), RESULTS (the
# working folder, default $OUT/results), EXTRA_FORWARD_ARGS / EXTRA_SWEEP_ARGS /
# EXTRA_BACKWARD_ARGS / EXTRA_HF_ARGS / EXTRA_CP_ARGS / EXTRA_FSDP_ARGS / EXTRA_GLUONBWD_ARGS.
# What comes back: $OUT/run_all.log, the markdown tables and the test log next to it,
# and $OUT/results.tar.gz with everything (JSON included) — at most 8 files.
set -x
set -o pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the results folder}"
TOTAL_S=${TOTAL_S:-540}
RESULTS=${RESULTS:-$OUT/results}
mkdir -p "$RESULTS"
exec > >(tee -a "$OUT/run_all.log") 2>&1
tee_pid=$!
start=$(date +%s)
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests quick sweep)

# Seconds a step may use: its cap, or what is left of TOTAL_S less 20 s for packing up.
budget() {
  local cap=$1 left
  left=$(( TOTAL_S - ($(date +%s) - start) - 20 ))
  [ "$left" -lt "$cap" ] && cap=$left
  echo "$cap"
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version,power.limit --format=csv || true
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'

status=0
for step in "${steps[@]}"; do
  echo "=== step $step, $(( $(date +%s) - start ))s elapsed ==="
  case $step in
    tests)
      t=$(budget 170)
      [ "$t" -lt 30 ] && { echo "no time left for $step"; continue; }
      xdist=()
      python3 -c 'import xdist' 2>/dev/null && xdist=(-n 8)
      timeout -k 10 "$t" python3 -m pytest -m gpu python_tests -q -rfEs -p no:cacheprovider \
        --continue-on-collection-errors "${xdist[@]}" 2>&1 | tee "$RESULTS/gpu_tests.log" || status=1
      ;;
    quick|forward)
      if [ "$step" = quick ]; then cap=200; extra=(--quick); else cap=500; extra=(); fi
      t=$(budget $cap)
      [ "$t" -lt 60 ] && { echo "no time left for $step"; continue; }
      # shellcheck disable=SC2086
      timeout -k 10 "$t" python3 benchmarks/bench_forward.py --out "$RESULTS/$step" --budget-s $(( t - 45 )) \
        "${extra[@]}" ${EXTRA_FORWARD_ARGS:-} || status=1
      ;;
    sweep|tiles|rotation)
      if [ "$step" = sweep ]; then part=tiles,rotation; cap=240; elif [ "$step" = tiles ]; then part=tiles; cap=240;
      else part=rotation; cap=90; fi
      t=$(budget $cap)
      [ "$t" -lt 45 ] && { echo "no time left for $step"; continue; }
      # shellcheck disable=SC2086
      timeout -k 10 "$t" python3 benchmarks/sweep_tiles.py --out "$RESULTS/$step" --part $part \
        --budget-s $(( t - 30 )) ${EXTRA_SWEEP_ARGS:-} || status=1
      ;;
    ablation)
      t=$(budget 150)
      [ "$t" -lt 45 ] && { echo "no time left for $step"; continue; }
      timeout -k 10 "$t" python3 benchmarks/ablation.py --out "$RESULTS/ablation" --shapes paper,llama \
        --budget-s $(( t - 30 )) || status=1
      ;;
    backward)
      t=$(budget 560)
      [ "$t" -lt 90 ] && { echo "no time left for $step"; continue; }
      # shellcheck disable=SC2086
      timeout -k 10 "$t" python3 benchmarks/bench_backward.py --out "$RESULTS/backward" --budget-s $(( t - 60 )) \
        ${EXTRA_BACKWARD_ARGS:-} || status=1
      ;;
    hf)
      t=$(budget 560)
      [ "$t" -lt 90 ] && { echo "no time left for $step"; continue; }
      # shellcheck disable=SC2086
      timeout -k 10 "$t" python3 benchmarks/bench_hf.py --out "$RESULTS/hf" ${EXTRA_HF_ARGS:-} || status=1
      ;;
    host)
      t=$(budget 90)
      [ "$t" -lt 40 ] && { echo "no time left for $step"; continue; }
      timeout -k 10 "$t" python3 benchmarks/host_path.py --out "$RESULTS/host" || status=1
      ;;
    gluon)
      t=$(budget 240)
      [ "$t" -lt 90 ] && { echo "no time left for $step"; continue; }
      timeout -k 10 "$t" python3 benchmarks/gluon/attention_sm90.py --out "$RESULTS/gluon" --budget-s $(( t - 20 )) \
        || status=1
      ;;
    gluonbwd)
      t=$(budget 300)
      [ "$t" -lt 90 ] && { echo "no time left for $step"; continue; }
      # shellcheck disable=SC2086
      timeout -k 10 "$t" python3 benchmarks/gluon/backward_ab.py --out "$RESULTS/gluonbwd" ${EXTRA_GLUONBWD_ARGS:-} \
        || status=1
      ;;
    tanh)
      t=$(budget 300)
      [ "$t" -lt 90 ] && { echo "no time left for $step"; continue; }
      timeout -k 10 "$t" python3 benchmarks/tanh_approx.py --out "$RESULTS/tanh" || status=1
      ;;
    cptests)
      t=$(budget 150)
      [ "$t" -lt 30 ] && { echo "no time left for $step"; continue; }
      timeout -k 10 "$t" python3 -m pytest -m gpu python_tests/test_distributed_gpu.py -q -rfEs -p no:cacheprovider \
        2>&1 | tee "$RESULTS/cp_tests.log" || status=1
      ;;
    cp)
      t=$(budget 280)
      [ "$t" -lt 90 ] && { echo "no time left for $step"; continue; }
      # shellcheck disable=SC2086
      timeout -k 10 "$t" python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_cp.py \
        --out "$RESULTS/cp" --budget-s $(( t - 70 )) ${EXTRA_CP_ARGS:-} || status=1
      ;;
    fsdp)
      t=$(budget 300)
      [ "$t" -lt 120 ] && { echo "no time left for $step"; continue; }
      # shellcheck disable=SC2086
      timeout -k 10 "$t" python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/train_fsdp.py \
        --out "$RESULTS/fsdp" --budget-s $(( t - 110 )) ${EXTRA_FSDP_ARGS:-} || status=1
      ;;
    *)
      echo "unknown step '$step' (expected tests, quick, forward, sweep, tiles, rotation, ablation, backward, hf, host, gluon, gluonbwd, tanh, cptests, cp, fsdp)"; status=2
      ;;
  esac
done

# Pack up: everything in one archive, the readable files beside it (8 files at most).
tar -czf "$OUT/results.tar.gz" -C "$RESULTS" . || status=1
n=2  # run_all.log and results.tar.gz
for f in "$RESULTS"/gpu_tests.log "$RESULTS"/*/*.md; do
  [ -f "$f" ] || continue
  [ $n -ge 8 ] && break
  dest="$OUT/$(basename "$(dirname "$f")")_$(basename "$f")"
  [ "$(dirname "$f")" = "$RESULTS" ] && dest="$OUT/$(basename "$f")"
  cp "$f" "$dest" && n=$((n + 1))
done
[ "$RESULTS" = "$OUT/results" ] && rm -rf "$RESULTS"
echo "=== run_all done in $(( $(date +%s) - start ))s, status $status ==="
exec 1>&- 2>&-
wait $tee_pid
exit $status
