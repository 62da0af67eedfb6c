# call D (right after n3.sh): a second, shorter fine-tune of both heads on the same seed-3 mix from call C's heads
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
ls -l /root/w/work/self100000-seed3/mix.npz || exit 1
python3 bench/train_default_heads.py /root/w/run2 --data-dir /root/data --self-prompts 100000 --seed 3 \
  --work-dir /root/w/work --warm-start /root/w/run/weights --eagle-ttt-steps 3 --deadline-s 300 --eval-reserve-s 55 --eval-k 3,5 \
  --eval-args "--dataset held_out_seed2=/root/data/held_out_seed2.jsonl"
echo "rc $? t=$SECONDS"
rm -f /root/w/run2/prompts/train.jsonl
tar cf - -C /root/w run2 | split -b 15000000 -d -a 1 - $OUT/run2.tar.
ls -l $OUT; echo "done t=$SECONDS"
