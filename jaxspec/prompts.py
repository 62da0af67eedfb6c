"""Prompt files (JSONL), read the one way the benchmarks, the acceptance tables and the head training share.

A row is a conversation: `messages` (chat dicts), `turns` (MT-bench style: strings, whose first is the prompt, or
chat dicts), or a single user turn in `prompt` or `question` (GSM8K). A row with none of these is an error naming
its file and line, as is a line that is not JSON.
"""

from __future__ import annotations

from pathlib import Path

from jaxspec.json_config import parse_json

FIELDS = ("messages", "turns", "prompt", "question")


def conversation(row: dict, source: str) -> list[dict]:
    """The chat messages of one row, ending with the turn to answer (trailing assistant turns are dropped)."""
    if isinstance(row.get("messages"), list) and row["messages"]:
        msgs = list(row["messages"])
    elif isinstance(row.get("turns"), list) and row["turns"]:
        turns = row["turns"]
        # string turns: only the first (later ones would need the model's own earlier answers)
        msgs = list(turns) if isinstance(turns[0], dict) else [{"role": "user", "content": str(turns[0])}]
    else:
        text = next((row[k] for k in ("prompt", "question") if isinstance(row.get(k), str)), None)
        if text is None:
            raise ValueError(f"{source}: row has none of the fields {list(FIELDS)}: {sorted(row)}")
        msgs = [{"role": "user", "content": text}]
    while msgs and isinstance(msgs[-1], dict) and msgs[-1].get("role") == "assistant":
        msgs.pop()  # generate the assistant's reply, not continue after it
    if not msgs or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
        raise ValueError(f"{source}: the conversation needs chat messages with a 'content' string")
    return msgs


def read_conversations(paths: str | Path | list[str | Path], n: int | None = None) -> list[list[dict]]:
    """The first n conversations (all when n is None) of the JSONL files, in order. Taking the first n keeps every
    smaller count a prefix of the larger ones."""
    convs: list[list[dict]] = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if n is not None and len(convs) >= n:
                    return convs
                if line.strip():
                    source = f"{path}:{lineno}"
                    convs.append(conversation(parse_json(line, source), source))
    return convs


def first_user_text(msgs: list[dict]) -> str:
    """The text of a conversation's first user turn (what the one-turn training data regenerates an answer to)."""
    return next((m["content"] for m in msgs if m.get("role", "user") == "user"), msgs[0]["content"])


def read_prompts(paths: str | Path | list[str | Path], n: int | None = None) -> list[str]:
    """The first user turn of the first n conversations of the JSONL files."""
    return [first_user_text(c) for c in read_conversations(paths, n)]
