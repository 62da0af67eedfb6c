"""Chat-formatted prompts: one place that renders a conversation through the tokenizer's template and tokenizes
it (the engine, the trainer and the benchmarks all do)."""

from __future__ import annotations

from typing import Any


def render_chat(tokenizer: Any, messages: list[dict]) -> str:
    """The conversation as the model sees it, ending with the assistant's turn to speak."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_chat(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of a conversation through the chat template (which carries its own special tokens), or of its
    last message's text when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(render_chat(tokenizer, messages), add_special_tokens=False)
    return tokenizer.encode(messages[-1]["content"])
