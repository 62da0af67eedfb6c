"""Chat-formatted prompts: one place that renders a conversation through the tokenizer's template and tokenizes
it (the engine, the trainer and the benchmarks all do)."""

from __future__ import annotations

from typing import Any

CONTENT_FORMATS = ("auto", "string", "openai")  # vLLM's chat_template_content_format


def render_chat(tokenizer: Any, messages: list[dict], *, add_generation_prompt: bool = True,
                continue_final_message: bool = False, chat_template: str | None = None, tools: list[dict] | None = None,
                chat_template_kwargs: dict | None = None) -> str:
    """The conversation as the model sees it: by default ending with the assistant's turn to speak; with
    continue_final_message, ending inside its last message, which the model then continues (vLLM's options and
    defaults). chat_template replaces the tokenizer's; chat_template_kwargs are more variables for it."""
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be set: the first continues "
                         "the last message, the second starts a new assistant message")
    extra = dict(chat_template_kwargs or {})
    clash = sorted(set(extra) & {"add_generation_prompt", "continue_final_message", "chat_template", "tools",
                                 "tokenize", "conversation", "messages"})
    if clash:
        raise ValueError(f"chat_template_kwargs may not set {clash}: they are arguments of their own")
    # only the options that are set: the default call is the plain one every chat tokenizer takes
    options = {name: value for name, value in (("continue_final_message", continue_final_message),
                                               ("chat_template", chat_template), ("tools", tools)) if value}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **options, **extra)


def with_content_format(messages: list[dict], content_format: str = "auto") -> list[dict]:
    """vLLM's chat_template_content_format: each message's content as one string ("string", and "auto": the
    Llama-family templates take strings; list contents of text parts are joined) or as OpenAI's list of
    {"type": "text", "text"} parts ("openai"). Parts that are not text are refused by position."""
    if content_format not in CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format must be one of {', '.join(CONTENT_FORMATS)}, got "
                         f"{content_format!r}")
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"messages[{i}].content[{j}]: only text parts are supported, got {part!r}")
            content = "".join(part["text"] for part in content)
        if content_format == "openai" and isinstance(content, str):
            content = [{"type": "text", "text": content}]
        out.append({**message, "content": content} if "content" in message else dict(message))
    return out


def encode_chat(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of a conversation through the chat template (which carries its own special tokens), or of its
    last message's text when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(render_chat(tokenizer, messages), add_special_tokens=False)
    return tokenizer.encode(messages[-1]["content"])
