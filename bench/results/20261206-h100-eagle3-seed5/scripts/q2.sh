# call 2 (right after q1.sh): GGUF part 2, assemble, convert; the data (Magpie seed 5 prompts from the target, greedy
# answers with GSM8K train; held-out splits of seeds 0-4, GSM8K test and the human-written set excluded); the token
# dataset back as a compact npz in 15 MB parts
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data /root/m $OUT
cat /root/w/gg.00 .gpu/p2/gg.01 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
for f in .gpu/data2/*.xz; do xz -dc $f > /root/data/$(basename $f .xz); done; wc -l /root/data/*
python3 -m jaxspec fetch 2>&1 | tail -1
cp -r weights/smollm2-135m-instruct /root/w/target
echo "=== [t=$SECONDS] data"
W=/root/w/work/self100000-seed5
mkdir -p $W
timeout $((560 - SECONDS)) python3 -m jaxspec train-eagle --model smollm2-135m-instruct --seq-len 512 --max-tokens 384 \
  --gen-batch 1024 --seed 5 --dataset-cache $W/mix.npz --data-only --data self:100000 --data /root/data/gsm8k_train.jsonl \
  --exclude /root/data/gsm8k_test.jsonl --exclude bench/prompts/general_chat.jsonl \
  --exclude /root/data/held_out_seed0.jsonl --exclude /root/data/held_out_seed0b.jsonl \
  --exclude /root/data/held_out_seed1.jsonl --exclude /root/data/held_out_seed2.jsonl \
  --exclude /root/data/held_out_seed3.jsonl --exclude /root/data/held_out_seed4.jsonl --prompts-out $W/prompts \
  --prompts-time-budget-s 120 --gen-time-budget-s 200 > /root/w/data.log 2>&1
echo "rc $? t=$SECONDS"
grep -v "it/s\]" /root/w/data.log | tail -24
ls -l $W $W/prompts
python3 .gpu/s/pack_data.py $W/mix.npz /root/m/mix-seed5.npz && split -b 15000000 -d -a 1 /root/m/mix-seed5.npz $OUT/mix-seed5.npz.
cp /root/w/data.log $OUT/ && tar cf - -C $W prompts | xz -T8 > $OUT/prompts-seed5.tar.xz
ls -l $OUT; echo "done t=$SECONDS"
