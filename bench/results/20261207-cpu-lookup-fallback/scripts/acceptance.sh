# The shipped EAGLE-3 head (k = 3) alone and with prompt lookup (n-grams of 2-5) as its fallback: acceptance on the
# first 64 prompts of three data sets, greedy, 256 tokens (the repository root; held_out.jsonl and gsm8k_test.jsonl
# under .gpu/data). Argument: head or fallback
H='"method": "eagle3", "model": "weights/eagle3-smollm2-135m-instruct"'
if [ "$1" = head ]; then S="{$H}"; else S="{$H, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5}"; fi
PYTHONPATH=. python3 bench/acceptance.py --model weights/smollm2-135m-instruct --speculative-config "$S" --k 3 \
  --dataset held_out=.gpu/data/held_out.jsonl --dataset general_chat=bench/prompts/general_chat.jsonl \
  --dataset gsm8k_test=.gpu/data/gsm8k_test.jsonl --num-prompts 64 --max-tokens 256 --output-json $1.json
