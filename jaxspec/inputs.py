"""vLLM's prompt types (`vllm.inputs`): what `LLM.generate`, `LLM.beam_search` and `LLMEngine.add_request` take as
a prompt, besides a plain string or a list of token ids."""

from __future__ import annotations

from typing import NotRequired, TypedDict, Union


class TextPrompt(TypedDict):
    """A text, tokenized by the model's tokenizer."""
    prompt: str


class TokensPrompt(TypedDict):
    """Token ids, run as they are; `prompt` (optional) is the text the output reports as its prompt."""
    prompt_token_ids: list[int]
    prompt: NotRequired[str]


PromptType = Union[str, list[int], TextPrompt, TokensPrompt]
PROMPT_KEYS = frozenset(TextPrompt.__annotations__) | frozenset(TokensPrompt.__annotations__)
