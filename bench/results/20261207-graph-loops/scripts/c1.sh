# call 1 (issue 19): multi-step decoding's device loop inside XLA's command buffer. XLA's default command-buffer
# types leave WHILE and CONDITIONAL out, so M = 4's lax.scan runs as a host-driven while thunk that launches its
# body every iteration. W: XLA_FLAGS adding WHILE and CONDITIONAL. Random SmolLM2 weights, one process each.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
ALL=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION
W="--xla_gpu_enable_command_buffer=$ALL,WHILE,CONDITIONAL"
S=bench/results/20261207-graph-loops/scripts
XLA_FLAGS="$W" python3 -c "import jax; print('flag ok', jax.jit(lambda x: jax.lax.fori_loop(0, 4, lambda i, y: y * 2, x))(1.0))" 2>&1 | tail -1
E='{"num_speculative_tokens": 3}'
B1="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
run() {  # name flags m args...
  local name=$1 flags=$2 m=$3; shift 3
  echo "=== [t=$SECONDS] $name"
  XLA_FLAGS="$flags" PYTHONPATH=. timeout 120 python3 bench/throughput.py "$@" --num-scheduler-steps $m --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall" $OUT/r/$name.log | head -2
}
run warm "" 1 $B1 --max-tokens 64
# the same greedy tokens with W (random weights and head, the target's own acceptance)
PYTHONPATH=. timeout 120 python3 $S/same.py $OUT/r/same-m4.json 4 > $OUT/r/same-m4.log 2>&1; tail -1 $OUT/r/same-m4.log
XLA_FLAGS="$W" PYTHONPATH=. timeout 120 python3 $S/same.py $OUT/r/same-m4w.json 4 > $OUT/r/same-m4w.log 2>&1; tail -1 $OUT/r/same-m4w.log
# JAXSPEC_GRAPH_LOOPS: a draft KernelConfig field passing the same types per program (not landed; unset, it is the default)
JAXSPEC_GRAPH_LOOPS=1 PYTHONPATH=. timeout 120 python3 $S/same.py $OUT/r/same-m4k.json 4 > $OUT/r/same-m4k.log 2>&1; tail -1 $OUT/r/same-m4k.log
for o in m4w m4k; do
  python3 -c "import json,sys; a,b=(json.load(open(sys.argv[i])) for i in (1,2)); print('identical', sys.argv[2], a==b, sum(x==y for x,y in zip(a,b)), '/', len(a))" $OUT/r/same-m4.json $OUT/r/same-$o.json
done
# one dispatch of 4 steps onto an idle device (host time), and 4-step dispatches back to back
for f in "" "$W"; do
  echo "=== [t=$SECONDS] step_time M=4 flags=${f:+W}"
  XLA_FLAGS="$f" PYTHONPATH=. timeout 150 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --breakdown --batches 1,96 --k 3 --num-steps 4 --output-json $OUT/r/step-m4${f:+w}.json > $OUT/r/step-m4${f:+w}.log 2>&1; echo "rc $?"
  grep -v "^INFO\|^\[" $OUT/r/step-m4${f:+w}.log | tail -8
done
for n in 24 96; do
  for v in m4 m4w; do
    f=""; [ $v = m4w ] && f="$W"
    run busy-$n-$v "$f" 4 --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 256 --prefill-buckets 2048 --num-prompts $n --decode-buckets $n --speculative-config "$E" --synthetic-acceptance 0.6 --profile-dir /root/prof-$n-$v --profile-prompts $n
    grep -h "| async | $n |" $OUT/r/busy-$n-$v.log
  done
done
run eagle1-m1 "" 1 $B1 --speculative-config "$E" --synthetic-acceptance 0.6
run eagle1-m4 "" 4 $B1 --speculative-config "$E" --synthetic-acceptance 0.6
run eagle1-m4w "$W" 4 $B1 --speculative-config "$E" --synthetic-acceptance 0.6
run plain1-m1 "" 1 $B1
run plain1-m4 "" 4 $B1
run plain1-m4w "$W" 4 $B1
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
