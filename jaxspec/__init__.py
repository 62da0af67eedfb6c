"""jaxspec: Llama-family inference in JAX with EAGLE speculative decoding and async scheduling."""

import logging

from jaxspec.llm import LLM
from jaxspec.outputs import CompletionOutput, RequestOutput
from jaxspec.sampling_params import RequestOutputKind, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestOutputKind"]

# Like vLLM, jaxspec's own messages (KV cache size, compile progress) show at INFO on stderr unless the
# application configures the "jaxspec" logger itself.
_logger = logging.getLogger("jaxspec")
if not _logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s jaxspec: %(message)s", "%m-%d %H:%M:%S"))
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False
