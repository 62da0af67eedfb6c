# On this project's CPU machine (2 cores, no GPU): the plan writes of a timed round with page_reserve_whole off and
# on (ab.py, alternating rounds of one LLM), random SmolLM2 weights, EAGLE k = 3 at synthetic acceptance 0.6:
# batch 1 (1,024 tokens; 4 steps a dispatch and 1) and 24 prompts (256 tokens, 4 steps a dispatch). Timings on a
# CPU say nothing about a GPU's; the counts are what the scheduler does.
set -u
S=bench/results/20261207-graph-updates-b1/scripts
D=bench/results/20261207-graph-updates-b1/cpu
mkdir -p $D
E='--speculative-config {"num_speculative_tokens":3} --synthetic-acceptance 0.6'
B="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --ignore-eos --prefill-buckets 128"
ab() {  # name, args...
  local name=$1; shift
  PYTHONPATH=. python3 $S/ab.py $B $E "$@" --repeats 2 --output-json $D/$name.json > $D/$name.log 2>&1
  echo "$name: $(grep -o 'whole=[A-Za-z]* end .*plan writes [0-9]*' $D/$name.log | sed 's/ end [^ ]* tok\/s [^ ]* ms\/step [0-9a-f]*//' | tr '\n' ';')"
}
ab b1-m4 --num-prompts 1 --max-tokens 1024 --decode-buckets 1 --num-scheduler-steps 4
ab b1-m1 --num-prompts 1 --max-tokens 1024 --decode-buckets 1
ab n24-m4 --num-prompts 24 --max-tokens 256 --decode-buckets 24 --prefill-buckets 2048 --num-scheduler-steps 4
