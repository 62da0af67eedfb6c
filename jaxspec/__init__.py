"""jaxspec: Llama-family inference in JAX with EAGLE speculative decoding and async scheduling."""

from jaxspec.llm import LLM, CompletionOutput, RequestOutput
from jaxspec.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
