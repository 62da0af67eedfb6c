"""The public offline API, modelled on vLLM's `LLM`: load once, then `generate` / `chat` batches of requests, or
stream them; `llm_engine` is the step machine underneath (add_request / step / abort_request)."""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
from tqdm.auto import tqdm

from jaxspec import compile_cache, loader, parallel
from jaxspec.beam_search import BeamSearch, BeamSearchOutput
from jaxspec.chat import render_chat, with_content_format
from jaxspec.config import EngineConfig, SpeculativeConfig
from jaxspec.engine.input_processor import InputProcessor
from jaxspec.engine.llm_engine import LLMEngine
from jaxspec.engine.model_runner import BASIC_KINDS, ModelRunner
from jaxspec.engine.output_processor import OutputProcessor
from jaxspec.engine.sequence import Sequence
from jaxspec.engine.spec_policy import DynamicPolicy, make_policy
from jaxspec.engine_args import vllm_options
from jaxspec.generation_config import default_sampling_values
from jaxspec.metrics_reader import Metrics
from jaxspec.models import attention, eagle, llama
from jaxspec.models.kernel_config import KernelConfig
from jaxspec.outputs import RequestOutput
from jaxspec.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from jaxspec.structured_output import StructuredOutputsConfig
from jaxspec.tokenizer import eos_token_ids, load_tokenizer

logger = logging.getLogger("jaxspec")

# The KV pool on a CPU (no device memory to measure): at most this much, and at most CPU_KV_FRACTION of the
# memory available when the LLM is built. vLLM's CPU backend likewise takes a fixed KV space (VLLM_CPU_KVCACHE_SPACE).
CPU_KV_BYTES = 1 << 30
CPU_KV_FRACTION = 0.25


def available_memory() -> int:
    """Bytes of host memory available now (Linux MemAvailable; free pages elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class LLM:
    """`LLM(model=...)` loads a converted checkpoint, an HF Llama directory, or a preset name (e.g.
    "smollm2-135m-instruct", fetched and converted on first use). `LLM.from_weights` builds one over weights
    already in memory."""

    model_name = ""  # the model it was built from (get_metrics' label); from_weights: none

    def __init__(self, model: str, *, tokenizer: str | None = None, dtype: str = "auto", load_format: str = "auto",
                 seed: int = 0, speculative_config: dict | None = None, compilation_cache_dir: str | None = None,
                 **engine_args: Any):
        """Engine arguments (vLLM's names where vLLM has them; `EngineArgs` holds them all): max_model_len,
        max_num_seqs=64, max_num_batched_tokens=2048, async_scheduling=True, page_size=16 (alias block_size),
        num_pages=0 (size from memory; alias num_gpu_blocks_override),
        gpu_memory_utilization=0.85 (alias memory_fraction), kv_cache_memory_bytes, attn_impl="auto",
        layer_loop="auto", max_prefill_seqs=8, warmup="auto", decode_buckets, prefill_buckets,
        tensor_parallel_size=1, draft_tensor_parallel_size, max_logprobs=20, num_scheduler_steps=1 (decode steps
        per dispatch while nothing waits or prefills: multi-step decoding), page_lookahead=64 (positions of pages
        given ahead to every decoding sequence when one needs a page: EngineConfig), page_reserve_whole=True (pages
        for a sequence's whole length at once while free pages cover it), enable_prefix_caching=True (vLLM's
        automatic prefix caching, jaxspec.engine.block_manager), generation_config="auto" and
        override_generation_config (the model's sampling defaults, jaxspec.generation_config),
        structured_outputs_config (jaxspec.structured_output.StructuredOutputsConfig; guided_decoding_backend: vLLM's
        older name for its backend), kernel_config
        (KernelConfig; default: its defaults with JAXSPEC_* environment overrides); vLLM's options without a
        jaxspec setting are taken as `jaxspec.engine_args.vllm_options` says, download_dir is where a preset is
        fetched. compilation_cache_dir: jax's persistent compilation cache (None: ~/.cache/jaxspec/xla; "": off;
        see jaxspec/compile_cache.py)."""
        engine_args = vllm_options(engine_args)
        _check_known(engine_args)
        compile_cache.configure(compilation_cache_dir)
        path, target_cfg, target_w = loader.load_target(model, load_format, dtype,
                                                        weights_dir=engine_args.pop("download_dir", None),
                                                        revision=engine_args.pop("revision", None))
        self._build(target_cfg, target_w, tokenizer_dir=tokenizer or path, explicit_tokenizer=tokenizer is not None,
                    load_format=load_format, seed=seed, speculative_config=speculative_config, **engine_args)
        self.model_name = model

    @classmethod
    def from_weights(cls, config: llama.Config, weights: llama.Weights | None = None, *,
                     tokenizer: str | Path | None = None, load_format: str = "auto", seed: int = 0,
                     speculative_config: dict | None = None, synthetic_acceptance: float | None = None,
                     compilation_cache_dir: str | None = None, **engine_args: Any) -> "LLM":
        """An LLM over in-memory weights (tests, benchmarks, other programs); `weights=None` draws random ones of
        the config's shape. `tokenizer`: a directory holding one (optional). load_format="dummy" also draws a
        random EAGLE head, and `synthetic_acceptance` (benchmarks only) then accepts each draft position with
        that probability instead of by the target."""
        if synthetic_acceptance is not None and (speculative_config is None or load_format != "dummy"):
            raise ValueError("synthetic_acceptance is for load_format='dummy' runs with a speculative_config")
        engine_args = vllm_options(engine_args)
        _check_known(engine_args)
        engine_args.pop("download_dir", None)  # nothing is fetched
        engine_args.pop("revision", None)
        compile_cache.configure(compilation_cache_dir)
        llm = cls.__new__(cls)
        llm._build(config, weights, tokenizer_dir=tokenizer, explicit_tokenizer=tokenizer is not None,
                   load_format=load_format, seed=seed, speculative_config=speculative_config,
                   synthetic_acceptance=synthetic_acceptance, **engine_args)
        return llm

    def _build(self, target_cfg: llama.Config, target_w: llama.Weights | None, *, tokenizer_dir, explicit_tokenizer,
               load_format: str, seed: int, speculative_config, synthetic_acceptance: float | None = None,
               max_model_len: int | None = None, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
               async_scheduling: bool = True, page_size: int | None = None, num_pages: int | None = None,
               block_size: int | None = None, num_gpu_blocks_override: int | None = None,
               gpu_memory_utilization: float | None = None, memory_fraction: float = 0.85,
               kv_cache_memory_bytes: int | None = None, attn_impl: str = "auto", layer_loop: str = "auto",
               max_prefill_seqs: int = 8, warmup: bool | str = "auto", decode_buckets: list[int] | None = None,
               prefill_buckets: list[int] | None = None, tensor_parallel_size: int = 1,
               draft_tensor_parallel_size: int | None = None, max_logprobs: int = 20,
               kernel_config: KernelConfig | None = None, num_scheduler_steps: int = 1, page_lookahead: int = 64,
               page_reserve_whole: bool = True, enable_prefix_caching: bool | None = None,
               generation_config: str = "auto", override_generation_config: dict | None = None,
               structured_outputs_config: dict | None = None, guided_decoding_backend: str | None = None) -> None:
        loader.check_choice("load_format", load_format, loader.LOAD_FORMATS)
        self.default_sampling_values = default_sampling_values(tokenizer_dir, generation_config,
                                                               override_generation_config)
        spec = SpeculativeConfig.parse(speculative_config)
        if guided_decoding_backend is not None:  # vLLM's name before 0.11
            if structured_outputs_config is not None:
                raise ValueError("give structured_outputs_config or guided_decoding_backend (its old name), not both")
            structured_outputs_config = {"backend": guided_decoding_backend}
        structured = StructuredOutputsConfig.parse(structured_outputs_config)
        memory_fraction = _memory_fraction(gpu_memory_utilization, memory_fraction)
        page_size = _either("page_size", page_size, "block_size", block_size, 16)
        num_pages = _either("num_pages", num_pages, "num_gpu_blocks_override", num_gpu_blocks_override, 0)
        tp, draft_tp = tensor_parallel_size, draft_tensor_parallel_size or tensor_parallel_size
        if draft_tp not in (1, tp):
            raise ValueError(f"draft_tensor_parallel_size must be 1 (head replicated) or tensor_parallel_size={tp}, "
                             f"got {draft_tp}")
        if warmup not in (True, False, "auto"):
            raise ValueError(f"warmup must be True, False or 'auto', got {warmup!r}")
        target_cfg = target_cfg.replace(
            kernel=kernel_config or KernelConfig.from_env(),
            attn_impl=loader.default_attn_impl() if attn_impl == "auto" else attn_impl,
            layer_loop=loader.default_layer_loop() if layer_loop == "auto" else layer_loop)
        parallel.validate(target_cfg, tp)
        if target_w is None:
            target_w = llama.init(target_cfg, jax.random.key(seed))
        target_cfg, target_w = parallel.prepare(target_cfg, target_w, llama.abstract(target_cfg), tp)
        self.model_config = target_cfg
        self.tokenizer = load_tokenizer(tokenizer_dir, required=explicit_tokenizer) if tokenizer_dir else None
        draft_cfg = draft_w = None
        if spec is not None and not spec.is_ngram:  # ngram drafts from the sequence itself: no head
            draft_cfg, draft_w = loader.load_draft(spec, target_cfg, load_format, seed)
            draft_cfg, draft_w = parallel.prepare(draft_cfg, draft_w, eagle.abstract(draft_cfg), draft_tp,
                                                  "draft_tensor_parallel_size", "the draft head")
        max_model_len = _max_model_len(max_model_len, target_cfg)
        cfg = EngineConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, max_prefill_seqs=max_prefill_seqs,
                           page_size=page_size, num_pages=num_pages, memory_fraction=memory_fraction, seed=seed,
                           max_logprobs=max_logprobs, speculative=spec, decode_buckets=decode_buckets or [],
                           prefill_buckets=prefill_buckets or [], num_scheduler_steps=num_scheduler_steps,
                           page_lookahead=page_lookahead, page_reserve_whole=page_reserve_whole,
                           enable_prefix_caching=True if enable_prefix_caching is None else enable_prefix_caching,
                           grammar_states=structured.max_states, grammar_transitions=structured.max_transitions)
        cfg.num_pages = cfg.num_pages or self._size_kv_pool(cfg, target_cfg, draft_cfg, kv_cache_memory_bytes)
        if cfg.num_pages < cfg.pages_per_seq:
            raise ValueError(f"num_pages={cfg.num_pages} cannot hold one sequence of max_model_len="
                             f"{cfg.max_model_len} ({cfg.pages_per_seq} pages of {cfg.page_size})")
        self.engine_config = cfg
        mesh = parallel.make_mesh(tp) if tp > 1 else None
        runner = ModelRunner(cfg, target_cfg, target_w, draft_cfg, draft_w, synthetic_acceptance, mesh)
        policy = make_policy(spec, cfg.max_num_seqs)
        if warmup is True:
            self.num_compiled = runner.warmup(k_values=policy.choices)
        elif warmup == "auto" and jax.default_backend() != "cpu":
            self.num_compiled = runner.warmup(BASIC_KINDS, k_values=policy.choices)
        else:  # each program compiles on first use (logged), quicker to start on a CPU
            self.num_compiled = 0
        if isinstance(policy, DynamicPolicy):  # its step-time model, whatever warmup says
            policy.set_step_times(runner.time_decode(policy.choices))
            logger.info("step times (ms) by (decode bucket, k), medians: %s; ranked as (non-decreasing in k): %s",
                        *({key: round(t * 1e3, 3) for key, t in times.items()}
                          for times in (policy.measured_step_times, policy.step_times)))
        eos = eos_token_ids(self.tokenizer, Path(tokenizer_dir)) if tokenizer_dir else set()
        inputs = InputProcessor(self.tokenizer, target_cfg.vocab_size, max_model_len, seed, eos, max_logprobs,
                                structured, runner.grammar_pool)
        self.llm_engine = LLMEngine(cfg, runner, inputs, OutputProcessor(self.tokenizer, eos, max_model_len),
                                    async_scheduling, policy)
        self._next_request = 0
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread inside generate (re-entry from it would deadlock)
        self._owned: list[str] = []  # request ids of the generate call in progress (or interrupted)

    @staticmethod
    def _size_kv_pool(cfg: EngineConfig, tcfg: llama.Config, dcfg: eagle.EagleConfig | None,
                      kv_cache_memory_bytes: int | None) -> int:
        """Pages for the pool: what fits in the KV budget, at most enough for every slot at max_model_len. The
        budget: kv_cache_memory_bytes if given; on an accelerator, memory_fraction of it minus the weights; on a
        CPU, CPU_KV_BYTES or CPU_KV_FRACTION of the available memory, whichever is less."""
        enough = cfg.max_num_seqs * cfg.pages_per_seq + 1
        dtype = tcfg.jnp_dtype
        per_page = attention.page_bytes(tcfg.num_layers, tcfg.kv_heads_per_shard, cfg.page_size, tcfg.head_dim, dtype)
        if dcfg is not None:
            per_page += attention.page_bytes(1, dcfg.layer_config().kv_heads_per_shard, cfg.page_size,
                                             dcfg.head_dim, dtype)
        limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
        if kv_cache_memory_bytes is not None:
            if not isinstance(kv_cache_memory_bytes, int) or kv_cache_memory_bytes <= 0:
                raise ValueError(f"kv_cache_memory_bytes must be a positive integer, got {kv_cache_memory_bytes!r}")
            budget, why = kv_cache_memory_bytes, "kv_cache_memory_bytes"
        elif jax.default_backend() != "cpu" and limit:
            # per device: tensor parallelism splits weights and KV heads (a draft head at tp 1 is whole on each)
            weight_bytes = parallel.bytes_per_device(llama.abstract(tcfg), tcfg.tp_size)
            weight_bytes += parallel.bytes_per_device(eagle.abstract(dcfg), dcfg.tp_size) if dcfg else 0
            budget = int(limit * cfg.memory_fraction - weight_bytes)
            why = f"gpu_memory_utilization={cfg.memory_fraction} of {limit / 2**30:.1f} GiB, less the weights"
        else:
            budget = int(min(CPU_KV_BYTES, CPU_KV_FRACTION * available_memory()))
            why = (f"CPU: the smaller of {CPU_KV_BYTES / 2**30:.0f} GiB and {CPU_KV_FRACTION:.0%} of available memory; "
                   "pass kv_cache_memory_bytes or num_pages for more")
        pages = min(max(budget, 0) // per_page, enough)
        if pages < cfg.pages_per_seq:
            raise ValueError(f"the KV cache budget ({why}: {max(budget, 0) / 2**20:.0f} MiB) holds {pages} pages of "
                             f"{cfg.page_size} tokens, fewer than one sequence of max_model_len={cfg.max_model_len} "
                             f"needs ({cfg.pages_per_seq}): lower max_model_len or raise the budget")
        logger.info("KV cache: %d pages of %d tokens (%d tokens, %.2f GiB)%s; %s", pages, cfg.page_size,
                    pages * cfg.page_size, pages * per_page / 2**30,
                    " = every slot at max_model_len" if pages == enough else "", why)
        return pages

    # ---- the API

    def get_tokenizer(self) -> Any | None:
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use when given no sampling params: SamplingParams' defaults with the model's
        generation config on top (`generation_config`, jaxspec.generation_config), as in vLLM."""
        return SamplingParams(**self.default_sampling_values)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool | Callable[..., Any] = True, async_scheduling: bool | None = None, *,
                 lora_request: None = None, priority: list[int] | None = None) -> list[RequestOutput]:
        """Generate for text prompts or token-id lists; outputs come back in the order of the prompts. Every
        request is validated before any runs (a ValueError names the request). `async_scheduling` overrides
        the LLM's for this call (outputs are identical either way). Thread-safe: concurrent calls take turns.
        `use_tqdm` may be a tqdm-like callable that makes the progress bar; `lora_request` and `priority` are
        vLLM's, taken at their defaults (no LoRA adapters; first come, first served)."""
        _vllm_defaults(lora_request, priority)
        seqs = self._make_requests(prompts, sampling_params, RequestOutputKind.FINAL_ONLY)
        index = {seq.request_id: i for i, seq in enumerate(seqs)}
        results: list[RequestOutput | None] = [None] * len(seqs)
        # no tqdm object at all unless asked for: it takes a process-wide lock, which an interrupt landing inside
        # it can leave taken (every later bar would then hang)
        make_bar = use_tqdm if callable(use_tqdm) else tqdm
        bar = make_bar(total=len(seqs), desc="Processed prompts", dynamic_ncols=True) if use_tqdm else None
        start = last = time.perf_counter()
        processor = self.llm_engine.output_processor
        samples = [s for seq in seqs for s in seq.group]
        for s in samples:  # text made after the last step, all at once (OutputProcessor.decode_deferred)
            s.defer_text = not processor.live_text(s)
        with self._running(seqs):
            remaining = len(seqs)
            while remaining:
                for out in self.llm_engine.step(async_scheduling):
                    i = index.get(out.request_id)
                    if i is not None and out.finished:
                        results[i] = out
                        remaining -= 1
                now = time.perf_counter()
                if bar is not None and now - last >= 0.2:  # redrawn at most 5 times a second, off the hot path
                    last = now
                    bar.update(len(seqs) - remaining - bar.n)
                    tokens = sum(len(s.output_token_ids) for seq in seqs for s in seq.group)
                    bar.set_postfix_str(f"output: {tokens / (now - start):.0f} tok/s")
            processor.decode_deferred(samples)
            for out, seq in zip(results, seqs):
                for c in out.outputs:
                    c.text = seq.group[c.index].text
        if bar is not None:
            bar.update(len(seqs) - bar.n)
            bar.close()
        if self.llm_engine.k:
            m = self.llm_engine.spec_metrics
            logger.debug("spec decoding: mean acceptance length %.2f, per-position acceptance %s",
                        m.mean_acceptance_length, [round(r, 3) for r in m.as_dict()["acceptance_rate_per_position"]])
        return results

    def generate_stream(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                        async_scheduling: bool | None = None, *, lora_request: None = None,
                        priority: list[int] | None = None) -> Iterator[RequestOutput]:
        """Like `generate`, but yields each request's new text as it comes: RequestOutputs with only the tokens
        and text added since that request's last one (output_kind DELTA), the last with `finished=True`.
        `request_id` tells the requests apart ("0", "1", ... in the order of the prompts, offset by earlier
        calls). Closing the generator early aborts the requests still running."""
        _vllm_defaults(lora_request, priority)
        seqs = self._make_requests(prompts, sampling_params, RequestOutputKind.DELTA)
        ids = {seq.request_id for seq in seqs}
        with self._running(seqs):
            remaining = len(seqs)
            while remaining:
                for out in self.llm_engine.step(async_scheduling):
                    if out.request_id in ids:
                        remaining -= out.finished
                        yield out

    def chat(self, messages, sampling_params=None, use_tqdm: bool | Callable[..., Any] = True,
             async_scheduling: bool | None = None, *, lora_request: None = None, chat_template: str | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: list[dict] | None = None, chat_template_kwargs: dict | None = None,
             chat_template_content_format: str = "auto") -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them, through the model's chat template
        (or `chat_template`); the template options are vLLM's (jaxspec.chat.render_chat; contents as
        chat.with_content_format: strings, or lists of text parts)."""
        _vllm_defaults(lora_request, None)
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer with a chat template; this model has none")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        options = dict(chat_template=chat_template, add_generation_prompt=add_generation_prompt,
                       continue_final_message=continue_final_message, tools=tools,
                       chat_template_kwargs=chat_template_kwargs)
        texts = [render_chat(self.tokenizer, with_content_format(conv, chat_template_content_format), **options)
                 for conv in conversations]
        prompts = [{"prompt_token_ids": self.tokenizer.encode(t, add_special_tokens=False)} for t in texts]
        outs = self.generate(prompts, sampling_params, use_tqdm, async_scheduling)
        for out, text in zip(outs, texts):
            out.prompt = text
        return outs

    def beam_search(self, prompts, params: BeamSearchParams, lora_request: None = None, use_tqdm: bool = False,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """vLLM's beam search (jaxspec.beam_search): per prompt (a string, token ids or a prompt dict), the
        `params.beam_width` best beams, best first. Each step is one `generate` over the live beams;
        `concurrency_limit` prompts are searched at a time (all by default)."""
        _vllm_defaults(lora_request, None)
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"beam search needs a BeamSearchParams, got {type(params).__name__}")
        if 2 * params.beam_width > self.engine_config.max_logprobs:
            raise ValueError(f"BeamSearchParams.beam_width={params.beam_width}: each step asks for 2 * beam_width "
                             f"logprobs, more than max_logprobs={self.engine_config.max_logprobs} (the LLM's "
                             "max_logprobs argument)")
        if concurrency_limit is not None and (isinstance(concurrency_limit, bool) or not isinstance(
                concurrency_limit, int) or concurrency_limit < 1):
            raise ValueError(f"concurrency_limit must be a positive integer or None, got {concurrency_limit!r}")
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        processor, ids, max_len = self.llm_engine.input_processor, [], self.engine_config.max_model_len
        for i, prompt in enumerate(prompts):
            try:
                ids.append(processor.tokenize(prompt)[1])
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
            if len(ids[-1]) >= max_len:
                raise ValueError(f"prompt {i} has {len(ids[-1])} tokens, but max_model_len={max_len} leaves no room "
                                 "to generate")
        limit = concurrency_limit or max(len(ids), 1)
        decode = None if self.tokenizer is None else self.tokenizer.decode
        outputs: list[BeamSearchOutput] = []
        for start in range(0, len(ids), limit):
            search = BeamSearch(ids[start:start + limit], params, processor.eos_token_ids, max_len)
            step_params = search.step_params()
            bar = tqdm(total=params.max_tokens, desc="Beam search", unit="token") if use_tqdm else None
            while not search.done():
                beams = search.live()
                results = self.generate([{"prompt_token_ids": b.tokens} for b in beams], step_params, use_tqdm=False)
                search.advance([r.outputs[0].logprobs[0] for r in results])
                if bar is not None:
                    bar.update(1)
            if bar is not None:
                bar.close()
            outputs.extend(search.outputs(decode))
        return outputs

    def reset_prefix_cache(self) -> bool:
        """vLLM's: forget every cached prompt page, so the next requests prefill their whole prompts (to time a
        run without the cache, or after changing what a page would hold); False while requests hold pages."""
        with self._lock:
            return self.llm_engine.reset_prefix_cache()

    def get_metrics(self) -> Metrics:
        """vLLM's: the engine's counters and gauges as Metric objects under vLLM's names (jaxspec.metrics_reader);
        the list also reads `stats()` by name (`get_metrics()["mean_acceptance_length"]`)."""
        return Metrics(self.stats(), {"model_name": self.model_name, "engine": "0"})

    def stats(self) -> dict:
        """Speculative decoding counters, step timing, the scheduler's state, the tokens run through prefill, the
        prefix cache's queried and found prompt tokens, and the finished sequences (by finish reason) with their
        prompt and output tokens and vLLM's latency and size histograms of them (engine/request_histograms.py)."""
        engine = self.llm_engine
        t, sched = engine.times, engine.scheduler
        return {**engine.spec_metrics.as_dict(), "num_steps": t.num_steps, "num_dispatches": t.num_dispatches,
                "host_wait_s": t.host_wait_s,
                "wall_s": t.wall_s, "num_preemptions": sched.num_preemptions, "num_compiled": self.num_compiled,
                "num_steps_by_k": dict(engine.spec_policy.num_steps_by_k),
                "num_requests_running": len(sched.running), "num_requests_waiting": len(sched.waiting),
                "num_free_pages": engine.block_manager.num_free, "num_pages": self.engine_config.num_pages,
                "num_prefill_tokens": engine.runner.num_prefill_tokens,
                "prefix_cache_queries": engine.block_manager.prefix_queries,
                "prefix_cache_hits": engine.block_manager.prefix_hits,
                "num_finished": dict(engine.output_processor.num_finished),
                "num_finished_prompt_tokens": engine.output_processor.num_finished_prompt_tokens,
                "num_finished_output_tokens": engine.output_processor.num_finished_output_tokens,
                "request_histograms": engine.output_processor.histograms.snapshot()}

    # ---- requests of one call

    def _make_requests(self, prompts, params, output_kind: RequestOutputKind) -> list[Sequence]:
        """Validate every request before any is queued; the ValueError names the request (its index) and the
        problem. The call's params are copies with its output_kind (the caller's objects are not changed)."""
        if prompts is None:
            raise ValueError("prompts must be a string, a list of token ids, or a list of prompts; got None")
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and
                                                 isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None:
            params = self.get_default_sampling_params()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        seqs = []
        copies: dict[int, SamplingParams] = {}  # one copy per params object of the call, shared by its requests
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"request {i}: sampling params must be a SamplingParams, got {type(p).__name__}")
            try:
                if id(p) not in copies:
                    copies[id(p)] = replace(p, output_kind=output_kind)
                seqs.append(self.llm_engine.input_processor.process(str(self._next_request + i), prompt,
                                                                    copies[id(p)]))
            except ValueError as e:
                raise ValueError(f"request {i}: {e}") from None
        self._next_request += len(seqs)
        return seqs

    @contextmanager
    def _running(self, seqs: list[Sequence]):
        """Queue a call's requests and own the engine while it runs them; whatever way the call ends early (an
        exception, an interrupt, a closed generator), its requests are aborted and their pages freed before it
        returns."""
        if self._lock.locked() and self._owner == threading.get_ident():
            raise RuntimeError("generate / generate_stream / chat called again from the thread that is inside one "
                               "(e.g. from a generate_stream loop): finish or close the first call")
        with self._lock:
            self._owner = threading.get_ident()
            engine = self.llm_engine
            try:
                # left over from a call that was interrupted while it ended
                engine.abort_request(self._owned)
                engine.forget(self._owned)
                self._owned = [seq.request_id for seq in seqs]
                for seq in seqs:
                    engine.queue(seq)
                yield
                self._owned = []
            finally:
                if self._owned:
                    engine.abort_request(self._owned)
                    engine.drain()
                    engine.forget(self._owned)
                    self._owned = []
                self._owner = None


def _check_known(engine_args: dict[str, Any]) -> None:
    """Every engine argument is one `LLM` takes (before the model loads: a misspelt option should not cost a load)."""
    known = set(inspect.signature(LLM._build).parameters) | {"download_dir", "revision"}
    unknown = sorted(set(engine_args) - known)
    if unknown:
        raise ValueError(f"LLM got arguments it does not know: {unknown} (its arguments: LLM's docstring; vLLM's "
                         "options without a jaxspec setting: jaxspec.engine_args.vllm_options)")


def _vllm_defaults(lora_request: Any, priority: list[int] | None) -> None:
    """vLLM's per-call options that jaxspec has only at their defaults: no LoRA adapter, no request priorities
    (vLLM too refuses priorities unless its scheduler was built for them)."""
    if lora_request is not None:
        raise ValueError(f"lora_request={lora_request!r}: jaxspec has no LoRA adapters (pass None)")
    if priority is not None and any(priority):
        raise ValueError("priority: jaxspec schedules first come, first served (pass None or zeros)")


def _memory_fraction(gpu_memory_utilization: float | None, memory_fraction: float) -> float:
    """vLLM's gpu_memory_utilization, or its older jaxspec name memory_fraction: a fraction in (0, 1]."""
    value, name = ((gpu_memory_utilization, "gpu_memory_utilization") if gpu_memory_utilization is not None
                   else (memory_fraction, "memory_fraction"))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a fraction in (0, 1], got {value!r}")
    return float(value)


def _either(name: str, value: Any, vllm_name: str, vllm_value: Any, default: Any) -> Any:
    """A setting that has a jaxspec name and vLLM's (page_size / block_size): either one, not two that differ."""
    if value is not None and vllm_value is not None and value != vllm_value:
        raise ValueError(f"{name}={value!r} and {vllm_name}={vllm_value!r} name the same setting: pass one")
    return next((v for v in (value, vllm_value) if v is not None), default)


def _max_model_len(max_model_len: int | None, cfg: llama.Config) -> int:
    """The default (the model's positions, at most 4096) or the given length, which the positions must cover."""
    if max_model_len is None:
        return min(cfg.max_position_embeddings, 4096)
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
        raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
    if max_model_len > cfg.max_position_embeddings:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings="
                         f"{cfg.max_position_embeddings}")
    return max_model_len
