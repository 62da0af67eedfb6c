# call 1 (issue 19): verify-gemms call 7 found XLA updating the batch-1 EAGLE step's CUDA graph in the engine's timed
# run, untraced and unwatched: M = 4, 24 updates of the 1,884-node graph at ~9 ms each (a third of the run); M = 1,
# 23 of the 469-node graph at ~1.4 ms. Each update moves one allocation, and one executable is updated twice in a
# row. Here: what the host did just before each update (when.py's markers), and the tree without and with
# reserve-whole.patch (pages for each decoding sequence's whole length at once while free pages cover them: the
# plan stops changing), 4 steps a dispatch, two rounds. Random SmolLM2 weights, EAGLE k = 3,
# synthetic acceptance 0.6, batch 1, 1,024 tokens, one process each.
set -u
export PYTHONUNBUFFERED=1
S=bench/results/20261207-graph-updates-b1/scripts
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
python3 -c "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)"
so=$(python3 -c "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))")
echo "update modes: $(strings -n 4 $so/*.so 2>/dev/null | grep -A6 '^CommandBufferUpdateMode$' | head -8 | tr '\n' ' ')"
B="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
E='--speculative-config {"num_speculative_tokens":3} --synthetic-acceptance 0.6'
run() {  # name, env, limit, args...
  local name=$1 env=$2 limit=$3; shift 3
  echo "=== [t=$SECONDS] $name ($env $*)"
  env TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 $env PYTHONPATH=. timeout $limit \
    python3 $S/when.py $B $E "$@" --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall" $OUT/r/$name.log
  echo "  records $(grep -c 'Initialized command buffer' $OUT/r/$name.log), updates $(grep -c 'Updated command buffer' $OUT/r/$name.log)"
  python3 $S/before_update.py $OUT/r/$name.log > $OUT/r/$name.updates.txt; tail -1 $OUT/r/$name.updates.txt | cut -c1-300
}
old() { (git apply -R $S/reserve-whole.patch 2>/dev/null || patch -R -p1 < $S/reserve-whole.patch) > /dev/null; }
new() { (git apply $S/reserve-whole.patch 2>/dev/null || patch -p1 < $S/reserve-whole.patch) > /dev/null; }
old  # the tree carries the patch: the runs before it first
for r in 1 2; do  # without reserve-whole.patch, then with it, alternating
  run m4-old-$r "" 150 --num-scheduler-steps 4
  new
  run m4-whole-$r "" 60 --num-scheduler-steps 4
  [ $r = 2 ] || old
done
echo "| run | output tok/s | graph updates |"
for f in $OUT/r/m[14]-*.log; do
  n=$(basename $f .log); t=$(grep -o "[0-9.]* output tokens/s" $f | head -1 | cut -d' ' -f1)
  echo "| $n | $t | $(grep -c 'Updated command buffer' $f) |"
done
head -12 $OUT/r/m4-old-1.updates.txt | cut -c1-400
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
