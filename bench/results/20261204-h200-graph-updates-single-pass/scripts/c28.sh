# issue 19 item 1 / 17 / 20: two executables per decode program with stable output buffers, alternating (.gpu/twin.py)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 120 python3 .gpu/twin.py 1 0 2>&1 | grep -E "^B=|Error"
timeout 150 python3 .gpu/twin.py 96 3 2>&1 | grep -E "^B=|Error"
timeout 150 python3 .gpu/twin.py 96 3 '{"logprobs": 5, "presence_penalty": 0.5}' 2>&1 | grep -E "^B=|Error"
echo "done t=$SECONDS"
