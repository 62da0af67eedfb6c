# issue 17: where the extended step's extra idle time goes. Greedy and logprobs=5 + presence_penalty=0.5 steps
# (random SmolLM2 weights, EAGLE-1 k = 3, batch 96, context 512): kernel profile, the idle gaps on the stream by
# the kernels around them, and the optimized HLO (command buffers)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
S="python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40"
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"
  XLA_FLAGS="--xla_dump_to=/root/dump-$name --xla_dump_hlo_module_re=.*decode_step.*" timeout 200 $S --profile-dir /root/prof-$name --output-json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1
  grep -E "^B=" $OUT/r/$name.log | head -3
  python3 .gpu/gaps.py /root/prof-$name 53 > $OUT/r/gaps-$name.txt 2>&1; head -14 $OUT/r/gaps-$name.txt
  ls /root/dump-$name | head -50 > $OUT/r/dump-$name.ls
  tar cJf $OUT/r/dump-$name.tar.xz -C /root/dump-$name $(cd /root/dump-$name && ls | grep -E "after_optimizations(\.txt|-buffer-assignment)" | head -8)
}
run greedy
run presence --sampling '{"logprobs": 5, "presence_penalty": 0.5}'
ls -la $OUT/r
echo "done t=$SECONDS"
