# Issue 19 item 1/2: where a decode dispatch's host time goes, and what multi-step does (random SmolLM2 weights)
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
S="timeout 150 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --breakdown"
run() { [ $SECONDS -gt 470 ] && { echo "skip $1 (time)"; return; }; name=$1; shift; echo "=== $name: $*"; "$@" --output-json $OUT/$name.json 2>$OUT/$name.err | grep -v "^INFO\|^WARNING" ; grep -i "error" $OUT/$name.err | head -3; }
run k0 $S --batches 1,96 --k 0
XLA_FLAGS=--xla_gpu_enable_command_buffer= run k0_nocb $S --batches 1,96 --k 0
run k0_scan $S --batches 1 --k 0 --layer-loop scan
XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL run k0_scan_while $S --batches 1 --k 0 --layer-loop scan
run k0_m8 $S --batches 1 --k 0 --num-steps 8
XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL run k0_m8_while $S --batches 1 --k 0 --num-steps 8
run k3 $S --batches 1,96 --k 3
run k3_m8 $S --batches 1 --k 3 --num-steps 8
T="timeout 120 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1"
run tp_m1 $T --num-scheduler-steps 1
run tp_m8 $T --num-scheduler-steps 8
echo "=== vlog"
TF_CPP_VMODULE=command_buffer_thunk=2,command_buffer_cmd=2 TF_CPP_MIN_LOG_LEVEL=0 timeout 120 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 10 --batches 1 --k 0 > $OUT/vlog.out 2> $OUT/vlog.err
wc -l $OUT/vlog.err
grep -o "command_buffer_[a-z]*\.cc:[0-9]*\] .\{0,50\}" $OUT/vlog.err | sed 's/[0-9][0-9]*/N/g' | sort | uniq -c | sort -rn | head -15
gzip $OUT/vlog.err
