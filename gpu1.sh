python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . ; export PATH=/tmp/site/bin:$PATH; export ATTNFUSE_CACHE_DIR=/tmp/afc; export PYTHONUNBUFFERED=1
cd $PWD
(
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"
timeout 150 python -m pytest -q -p no:cacheprovider python_tests/test_gpu_gluon_bwd.py -k "positions or transposed or (gradients and rope)" 2>&1 | tail -15
timeout 100 python -m pytest -q -p no:cacheprovider python_tests/test_gpu_gluon.py -k "rope" 2>&1 | tail -8
timeout 120 python -m pytest -q -p no:cacheprovider python_tests/test_gpu_hf.py python_tests/test_gpu_grad.py python_tests/test_gpu_graphs.py -k "positions or hf or static_cache or generate" 2>&1 | tail -8
date -u
) > $OUT/tests.log 2>&1
timeout 200 python benchmarks/bench_hf.py --parts train --ns 4096 --impls sdpa_cudnn+liger_rope,attnfuse --profile --out $OUT/hf > $OUT/bench.log 2>&1
date -u >> $OUT/bench.log
