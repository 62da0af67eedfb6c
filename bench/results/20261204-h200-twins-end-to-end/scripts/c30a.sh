# call 1: GGUF part 1 onto the machine, a throwaway JAX process; then the engine end to end with twin programs on
# and off (JAXSPEC_TWIN_PROGRAMS=0), random SmolLM2 weights, one process each, alternating on/off twice
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /root/w $OUT/r && cp .gpu/p1/m.xz.0 /root/w/
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; lscpu | grep "Model name"
T="python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128"
for i in 1 2; do
  for tw in 1 0; do
    echo "=== [t=$SECONDS] round $i twin_programs=$tw"
    JAXSPEC_TWIN_PROGRAMS=$tw timeout 90 $T --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 \
      --prefill-buckets 128 --output-json $OUT/r/b1-tw$tw-$i.json > $OUT/r/b1-tw$tw-$i.log 2>&1
    echo "b1 rc $?"; grep -E "^Throughput|ms/step" $OUT/r/b1-tw$tw-$i.log | head -2
    JAXSPEC_TWIN_PROGRAMS=$tw timeout 100 $T --num-prompts 96 --max-tokens 512 --ignore-eos \
      --speculative-config '{"num_speculative_tokens": 3}' --synthetic-acceptance 0.6 --decode-buckets 96 \
      --prefill-buckets 2048 --repeats 3 --output-json $OUT/r/s96-tw$tw-$i.json > $OUT/r/s96-tw$tw-$i.log 2>&1
    echo "s96 rc $?"; grep -E "^Throughput|ms/step" $OUT/r/s96-tw$tw-$i.log | tail -2
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
