"""jaxspec: Llama-family inference in JAX with EAGLE speculative decoding and async scheduling.

The public names load lazily, so that importing a submodule (say `jaxspec.models`) imports only what it needs.
"""

import importlib
import logging

_PUBLIC = {"LLM": "jaxspec.llm", "SamplingParams": "jaxspec.sampling_params",
           "RequestOutputKind": "jaxspec.sampling_params", "RequestOutput": "jaxspec.outputs",
           "CompletionOutput": "jaxspec.outputs", "EngineArgs": "jaxspec.engine_args",
           "LLMEngine": "jaxspec.engine.llm_engine", "AsyncLLMEngine": "jaxspec.async_engine",
           "AsyncEngineArgs": "jaxspec.async_engine", "BeamSearchParams": "jaxspec.sampling_params",
           "BeamSearchOutput": "jaxspec.beam_search", "BeamSearchSequence": "jaxspec.beam_search",
           "TextPrompt": "jaxspec.inputs", "TokensPrompt": "jaxspec.inputs", "PromptType": "jaxspec.inputs"}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'jaxspec' has no attribute {name!r}")


# Like vLLM, jaxspec's own messages (KV cache size, compile progress) show at INFO on stderr unless the
# application configures the "jaxspec" logger itself.
_logger = logging.getLogger("jaxspec")
if not _logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s jaxspec: %(message)s", "%m-%d %H:%M:%S"))
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False
