"""The public offline API, modelled on vLLM's `LLM`: load once, then `generate` / `chat` batches of requests."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxspec import parallel
from jaxspec.chat import render_chat
from jaxspec.config import EngineConfig, SpeculativeConfig
from jaxspec.engine.llm_engine import LLMEngine
from jaxspec.engine.model_runner import ModelRunner
from jaxspec.engine.output_processor import OutputProcessor
from jaxspec.engine.sequence import Sequence
from jaxspec.models import eagle, llama
from jaxspec.sampling_params import SamplingParams
from jaxspec.tokenizer import eos_token_ids, load_tokenizer

logger = logging.getLogger("jaxspec")


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


def _default_attn_impl() -> str:
    return "pallas" if jax.default_backend() == "gpu" else "xla"


def _default_dtype() -> str | None:
    """bf16 on an accelerator (as the checkpoints' torch_dtype says for Llama models); the stored dtype elsewhere."""
    return "bfloat16" if jax.default_backend() == "gpu" else None


def _default_layer_loop() -> str:
    return "unroll" if jax.default_backend() == "gpu" else "scan"


def _place_weights(target_w, draft_w, mesh, tp: int, draft_tp: int) -> tuple:
    """On the device; under tensor parallelism straight onto their shards, so the whole copies are freed before
    the runner allocates the KV pool."""
    if mesh is None:
        return jax.tree.map(jnp.asarray, target_w), (None if draft_w is None else jax.tree.map(jnp.asarray, draft_w))
    target_w = parallel.place(target_w, parallel.weight_shardings(target_w, mesh, tp))
    if draft_w is not None:
        draft_w = parallel.place(draft_w, parallel.weight_shardings(draft_w, mesh, draft_tp))
    return target_w, draft_w


class LLM:
    """`LLM(model=...)` loads a converted checkpoint, an HF Llama directory, or a preset name (e.g.
    "smollm2-135m-instruct", fetched and converted on first use)."""

    def __init__(self, model: str, *, tokenizer: str | None = None, max_model_len: int | None = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048, async_scheduling: bool = True,
                 seed: int = 0, dtype: str = "auto", speculative_config: dict | None = None,
                 page_size: int = 16, num_pages: int = 0, memory_fraction: float = 0.85,
                 attn_impl: str = "auto", layer_loop: str = "auto", max_prefill_seqs: int = 8,
                 load_format: str = "auto", weights: tuple | None = None, warmup: bool = True,
                 synthetic_acceptance: float | None = None, decode_buckets: list[int] | None = None,
                 prefill_buckets: list[int] | None = None, tensor_parallel_size: int = 1,
                 draft_tensor_parallel_size: int | None = None):
        spec = SpeculativeConfig.parse(speculative_config)
        tp, draft_tp = tensor_parallel_size, draft_tensor_parallel_size or tensor_parallel_size
        if draft_tp not in (1, tp):
            raise ValueError(f"draft_tensor_parallel_size must be 1 (head replicated) or tensor_parallel_size={tp}, "
                             f"got {draft_tp}")
        if synthetic_acceptance is not None and (spec is None or load_format != "dummy"):
            raise ValueError("synthetic_acceptance is for load_format='dummy' runs with a speculative_config")
        path, target_cfg, target_w = self._load_target(model, weights, load_format, dtype, seed)
        target_cfg = target_cfg.replace(
            attn_impl=_default_attn_impl() if attn_impl == "auto" else attn_impl,
            layer_loop=_default_layer_loop() if layer_loop == "auto" else layer_loop)
        parallel.validate(target_cfg, tp)
        if target_w is None:
            target_w = llama.init(target_cfg, jax.random.key(seed))
        target_cfg, target_w = parallel.prepare(target_cfg, target_w, tp)
        self.model_config = target_cfg
        self.tokenizer = load_tokenizer(tokenizer, required=True) if tokenizer else load_tokenizer(path)
        draft_cfg = draft_w = None
        if spec is not None:
            draft_cfg, draft_w = self._load_draft(spec, target_cfg, load_format, seed)
            draft_cfg, draft_w = parallel.prepare(draft_cfg, draft_w, draft_tp, "draft_tensor_parallel_size")
        max_model_len = max_model_len or min(target_cfg.max_position_embeddings, 4096)
        cfg = EngineConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, max_prefill_seqs=max_prefill_seqs,
                           page_size=page_size, num_pages=num_pages, memory_fraction=memory_fraction,
                           async_scheduling=async_scheduling, seed=seed, speculative=spec,
                           decode_buckets=decode_buckets or [], prefill_buckets=prefill_buckets or [])
        cfg.num_pages = cfg.num_pages or self._size_kv_pool(cfg, target_cfg, draft_cfg, target_w, draft_w)
        if cfg.num_pages < cfg.pages_per_seq:
            raise ValueError(f"num_pages={cfg.num_pages} cannot hold one sequence of max_model_len="
                             f"{cfg.max_model_len} ({cfg.pages_per_seq} pages of {cfg.page_size})")
        self.engine_config = cfg
        mesh = parallel.make_mesh(tp) if tp > 1 else None
        target_w, draft_w = _place_weights(target_w, draft_w, mesh, tp, draft_tp)
        runner = ModelRunner(cfg, target_cfg, target_w, draft_cfg, draft_w, synthetic_acceptance, mesh)
        # warmup=False compiles each bucket on first use instead (quicker start for tests and one-off scripts)
        self.num_compiled = runner.warmup() if warmup else 0
        processor = OutputProcessor(self.tokenizer, eos_token_ids(self.tokenizer, path), max_model_len)
        self.engine = LLMEngine(cfg, runner, processor)
        self._next_request = 0

    @classmethod
    def _load_target(cls, model: str, weights: tuple | None, load_format: str, dtype: str,
                     seed: int) -> tuple[Path, llama.Config, llama.Weights | None]:
        """(path, config, weights); weights None for load_format='dummy' (random ones are made after the config
        is final)."""
        if weights is not None:  # (Config, Weights) given directly: tests and embedding in other programs
            return Path(model), *weights
        if load_format == "dummy":  # random weights of a real shape: speed measurements without the weights
            return Path(model), cls._dummy_config(Path(model), dtype), None
        from jaxspec.convert.checkpoint import load_model

        path = cls._resolve(model)
        return path, *load_model(path, _default_dtype() if dtype == "auto" else dtype)

    @staticmethod
    def _resolve(model: str) -> Path:
        path = Path(model)
        if path.exists():
            return path
        from jaxspec import presets
        if model in presets.list_presets():
            return presets.fetch_preset(model)
        raise ValueError(f"model {model!r} is neither a directory nor a known preset ({presets.list_presets()})")

    @staticmethod
    def _dummy_config(path: Path, dtype: str) -> llama.Config:
        """The shape of a model from its config.json alone (a directory or the file itself)."""
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.exists():
            raise ValueError(f"{config_file}: load_format='dummy' needs a config.json to take the shape from")
        hf = json.loads(config_file.read_text())
        if dtype == "auto":
            stored = hf.get("dtype", hf.get("torch_dtype", "bfloat16"))  # transformers 5 writes "dtype"
            dtype = {"bfloat16": "bfloat16", "float16": "bfloat16"}.get(stored, "float32")
        return llama.Config.from_hf(hf, dtype=dtype, source=str(config_file))

    @staticmethod
    def _load_draft(spec: SpeculativeConfig, target_cfg: llama.Config, load_format: str,
                    seed: int) -> tuple[eagle.EagleConfig, eagle.EagleWeights]:
        from jaxspec.convert.eagle import load_eagle
        if load_format == "dummy":  # a head shaped like one target layer, random weights
            draft_cfg = eagle.EagleConfig.from_target(target_cfg, spec.method)
            draft_w = eagle.init(draft_cfg, jax.random.key(seed + 1))
        else:
            draft_cfg, draft_w = load_eagle(spec.model, target_cfg, spec.method)
        draft_cfg = draft_cfg.replace(attn_impl=target_cfg.attn_impl, dtype=target_cfg.dtype)
        dtype = target_cfg.jnp_dtype
        draft_w = jax.tree.map(lambda a: jnp.asarray(a).astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating)
                               else jnp.asarray(a), draft_w)
        return draft_cfg, draft_w

    @staticmethod
    def _size_kv_pool(cfg: EngineConfig, tcfg: llama.Config, dcfg: eagle.EagleConfig | None, tw, dw) -> int:
        """Pages for the pool: on an accelerator, what fits in memory_fraction of it next to the weights;
        elsewhere, enough for every slot at max_model_len."""
        enough = cfg.max_num_seqs * cfg.pages_per_seq + 1
        stats = jax.local_devices()[0].memory_stats() or {}
        limit = stats.get("bytes_limit")
        if jax.default_backend() == "cpu" or not limit:
            return enough
        # per device: tensor parallelism splits weights and KV heads (a draft head at tp 1 is whole on each)
        weight_bytes = parallel.bytes_per_device(tw, tcfg.tp_size)
        weight_bytes += parallel.bytes_per_device(dw, dcfg.tp_size) if dcfg else 0
        per_page = 2 * cfg.page_size * tcfg.jnp_dtype.itemsize * (
            tcfg.num_layers * tcfg.kv_heads_per_shard * tcfg.head_dim
            + (dcfg.layer_config().kv_heads_per_shard * dcfg.head_dim if dcfg else 0))
        fit = int((limit * cfg.memory_fraction - weight_bytes) // per_page)
        return max(min(fit, enough), cfg.pages_per_seq)

    # ---- requests

    def _make_sequences(self, prompts, params) -> list[Sequence]:
        """Validate every request before any runs; the ValueError names the request and the problem."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        seqs = []
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):
            text, ids = self._tokenize(i, prompt)
            try:
                self._validate(ids, p)
            except ValueError as e:
                raise ValueError(f"request {i}: {e}") from None
            rid = self._next_request + i
            seed = p.seed if p.seed is not None else (self.engine_config.seed * 1_000_003 + rid) % 2**32
            seqs.append(Sequence(request_id=rid, prompt_token_ids=ids, params=p, seed=seed, prompt=text))
        self._next_request += len(seqs)
        return seqs

    def _validate(self, ids: list[int], p: SamplingParams) -> None:
        p.validate()
        if p.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none")
        if len(ids) >= self.engine_config.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, but max_model_len="
                             f"{self.engine_config.max_model_len} leaves no room to generate")
        a = np.asarray(ids)  # one vectorized check: a Python loop over every prompt token costs ms per batch
        bad = a[(a < 0) | (a >= self.model_config.vocab_size)]
        if bad.size:
            raise ValueError(f"token ids {bad[:5].tolist()} are outside the vocabulary "
                             f"[0, {self.model_config.vocab_size})")

    def _tokenize(self, i: int, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"request {i}: a text prompt needs a tokenizer; pass token ids instead")
            ids = self.tokenizer.encode(prompt)
            text = prompt
        else:
            try:
                a = np.asarray(prompt)
            except ValueError:  # ragged nesting
                a = np.asarray(prompt, dtype=object)
            if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
                raise ValueError(f"request {i}: prompt token ids must be a flat sequence of integers, got "
                                 f"shape {a.shape} of {a.dtype}")
            ids, text = a.tolist(), None
        if not ids:
            raise ValueError(f"request {i}: the prompt is empty")
        return text, ids

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for text prompts or token-id lists; outputs come back in the order of the prompts."""
        seqs = self._make_sequences(prompts, sampling_params)
        for seq in seqs:
            self.engine.add(seq)
        bar = tqdm(total=len(seqs), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True)
        start = last = time.perf_counter()

        def progress() -> None:  # after a commit; redrawn at most 5 times a second, off the step's hot path
            nonlocal last
            now = time.perf_counter()
            if now - last < 0.2:
                return
            last = now
            bar.update(sum(s.is_finished for s in seqs) - bar.n)
            bar.set_postfix_str(f"output: {sum(len(s.output_token_ids) for s in seqs) / (now - start):.0f} tok/s")

        self.engine.run(on_commit=progress if use_tqdm else None)
        bar.update(len(seqs) - bar.n)
        bar.close()
        if self.engine.k:
            m = self.engine.spec_metrics
            logger.info("spec decoding: mean acceptance length %.2f, per-position acceptance %s",
                        m.mean_acceptance_length, [round(r, 3) for r in m.as_dict()["acceptance_rate_per_position"]])
        return [self._output(s) for s in seqs]

    def _output(self, seq: Sequence) -> RequestOutput:
        """A finished request's output; its text was decoded as it finished (OutputProcessor)."""
        return RequestOutput(request_id=str(seq.request_id), prompt=seq.prompt,
                             prompt_token_ids=seq.prompt_token_ids,
                             outputs=[CompletionOutput(0, seq.text, list(seq.output_token_ids), seq.finish_reason,
                                                       seq.stop_reason)])

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them, through the model's chat template."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer with a chat template; this model has none")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        texts = [render_chat(self.tokenizer, conv) for conv in conversations]
        prompts = [{"prompt_token_ids": self.tokenizer.encode(t, add_special_tokens=False)} for t in texts]
        outs = self.generate(prompts, sampling_params, use_tqdm)
        for out, text in zip(outs, texts):
            out.prompt = text
        return outs

    def get_metrics(self) -> dict:
        """Speculative decoding counters and step timing since the LLM was built."""
        t = self.engine.times
        return {**self.engine.spec_metrics.as_dict(), "num_steps": t.num_steps, "host_wait_s": t.host_wait_s,
                "wall_s": t.wall_s, "num_preemptions": self.engine.scheduler.num_preemptions,
                "num_compiled": self.num_compiled}
