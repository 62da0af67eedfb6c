# call 1 (issue 19): the EAGLE verify's 4-token matrix products at batch 1 (129 Triton GEMM fusions of 2.8-5.1 us,
# half of the step's 1.22 ms of kernels on an H100) against cuBLAS (JAXSPEC_CUBLAS_MIN_TOKENS=1 sends every
# step program's products to it). Kernel profiles at batch 1 and 8 (4 and 32 verify tokens), then the engine at batch
# 1, EAGLE k = 3, synthetic acceptance 0.6. Random SmolLM2 weights, one process each.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
ST="bench/step_time.py --hf-config smollm2-135m --context 256 --iters 32 --batches 1 8 --k 3"
B1="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --speculative-config {\"num_speculative_tokens\":3} --synthetic-acceptance 0.6"
for c in 64 1; do
  f=$OUT/r/prof-cublas$c
  echo "=== [t=$SECONDS] step_time cublas_min_tokens=$c"
  JAXSPEC_CUBLAS_MIN_TOKENS=$c PYTHONPATH=. timeout 120 python3 $ST --profile-dir /root/prof-$c --output-json $f.json > $f.log 2>&1; echo "rc $?"
  grep -v "^INFO\|^\[" $f.log | grep "device ms\|gemm\|cublas\|gemv\| step " | head -16
done
for c in 64 1 64 1; do
  echo "=== [t=$SECONDS] engine b1 cublas_min_tokens=$c"
  JAXSPEC_CUBLAS_MIN_TOKENS=$c PYTHONPATH=. timeout 100 python3 bench/throughput.py $B1 --output-json $OUT/r/engine-$SECONDS-c$c.json > $OUT/r/engine-$SECONDS-c$c.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall" $OUT/r/engine-*-c$c.log | tail -2
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
