# call 5: GGUF part 5, assemble, convert; the data stage (Magpie seed 2 prompts from the target, greedy answers)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl || exit 1
export PYTHONPATH=/root/site:.
cp .gpu/p5/m.xz.5 /root/w/ && mkdir -p weights/.cache/smollm2-135m-instruct /root/data /root/w/work/self100000-seed2 $OUT
cat /root/w/m.xz.1 /root/w/m.xz.2 /root/w/m.xz.3 /root/w/m.xz.4 /root/w/m.xz.5 | xz -d -T8 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum weights/.cache/smollm2-135m-instruct/*.gguf
for s in test train; do xz -dc .gpu/data/gsm8k_$s.jsonl.xz > /root/data/gsm8k_$s.jsonl; done
wc -l /root/data/*.jsonl
python3 -m jaxspec fetch 2>&1 | tail -1
echo "=== [t=$SECONDS] data"
W=/root/w/work/self100000-seed2
timeout $((590 - SECONDS)) python3 -m jaxspec train-eagle --model smollm2-135m-instruct --seq-len 512 --max-tokens 384 \
  --gen-batch 1024 --seed 2 --dataset-cache $W/mix.npz --data-only --data self:100000 --data /root/data/gsm8k_train.jsonl \
  --exclude /root/data/gsm8k_test.jsonl --exclude bench/prompts/general_chat.jsonl \
  --exclude bench/results/20261201-h200-general-heads/held_out.jsonl \
  --exclude bench/results/20261203-h200-heads-80k/prompts/held_out.jsonl --prompts-out $W/prompts \
  --prompts-time-budget-s 165 --gen-time-budget-s 265 > /root/w/data.log 2>&1
echo "rc $? t=$SECONDS"
grep -v "it/s\]" /root/w/data.log | tail -42
ls -l $W $W/prompts
cd /root/w && cp data.log work/self100000-seed2/ && tar cf - -C work self100000-seed2 | split -b 15000000 -d -a 1 - $OUT/data.tar.
ls -l $OUT; echo "done t=$SECONDS"
