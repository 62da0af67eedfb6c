# issue 19 item 1 / 17 / 20: the step output's host copy started at dispatch vs at the fetch, engine A/B
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 400 python3 .gpu/ab_copy.py .gpu/tok 7 2>&1 | grep -E "^prompts|Error|error" | head
echo "done t=$SECONDS"
