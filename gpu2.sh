python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . ; export PATH=/tmp/site/bin:$PATH; export ATTNFUSE_CACHE_DIR=/tmp/afc; export PYTHONUNBUFFERED=1
(
date -u; git log --oneline -1 2>/dev/null
timeout 80 python -m pytest -q -p no:cacheprovider python_tests/test_gpu_gluon.py -k "rope or qknorm" 2>&1 | tail -4
timeout 80 python -m pytest -q -p no:cacheprovider python_tests/test_gpu_gluon_bwd.py -k "positions or transposed" 2>&1 | tail -4
timeout 90 python -m pytest -q -p no:cacheprovider python_tests/test_gpu_hf.py python_tests/test_gpu_grad.py python_tests/test_gpu_graphs.py -k "positions or static_cache or llama or qwen" 2>&1 | tail -6
date -u
) > $OUT/tests.log 2>&1
timeout 320 python benchmarks/bench_hf.py --parts train,qwen --ns 4096,8192 --impls sdpa_cudnn+liger_rope,attnfuse --profile --out $OUT/hf > $OUT/bench.log 2>&1
date -u >> $OUT/bench.log
cd $OUT/hf && tar czf ../profiles.tgz profile_* && rm -f profile_*
