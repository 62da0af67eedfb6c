"""vLLM code with its import changed: the prompt types (`TextPrompt`, `TokensPrompt`) and the per-call options
vLLM's signatures have (`lora_request`, `priority`, a `use_tqdm` callable), taken at the values jaxspec serves and
refused by name otherwise."""

from __future__ import annotations

import pytest

from jaxspec import LLM, BeamSearchParams, SamplingParams, TextPrompt, TokensPrompt
from tests.tiny import make_llm, tiny_weights, write_char_tokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    return make_llm(tiny_weights(), write_char_tokenizer(tmp_path_factory.mktemp("vllm_api")))


def test_prompt_types(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("hello")
    plain = llm.generate(["hello"], GREEDY, use_tqdm=False)[0]
    outs = llm.generate([TextPrompt(prompt="hello"), TokensPrompt(prompt_token_ids=ids),
                         TokensPrompt(prompt_token_ids=ids, prompt="hello")], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [plain.outputs[0].token_ids] * 3
    assert [o.prompt for o in outs] == ["hello", None, "hello"]  # a TokensPrompt's text is reported when given
    (beams,) = llm.beam_search([TokensPrompt(prompt_token_ids=ids)], BeamSearchParams(beam_width=2, max_tokens=3))
    assert beams.sequences[0].tokens[:len(ids)] == ids


def test_vllm_call_options(llm):
    made = []

    def bar(**kw):  # vLLM takes a tqdm-like callable for the progress bar
        from tqdm import tqdm
        made.append(kw)
        return tqdm(disable=True, **kw)

    want = llm.generate(["abc"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    out = llm.generate(["abc"], GREEDY, use_tqdm=bar, lora_request=None, priority=[0])[0]
    assert out.outputs[0].token_ids == want and made and made[0]["total"] == 1
    assert llm.chat([{"role": "user", "content": "a"}], GREEDY, use_tqdm=False, lora_request=None,
                    chat_template="{{ messages[0]['content'] }}")[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="lora_request"):
        llm.generate(["abc"], GREEDY, lora_request=object())
    with pytest.raises(ValueError, match="priority"):
        llm.generate(["abc"], GREEDY, priority=[1])
    with pytest.raises(ValueError, match="lora_request"):
        llm.beam_search(["abc"], BeamSearchParams(beam_width=2, max_tokens=2), lora_request="adapter")
    assert llm.generate(["abc"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want  # nothing was queued


def test_sampling_params_clone_is_deep():
    p = SamplingParams(stop=["x"], logit_bias={3: 1.0}, seed=2)
    q = p.clone()
    q.stop.append("y")
    q.logit_bias[4] = 2.0
    assert p == SamplingParams(stop=["x"], logit_bias={3: 1.0}, seed=2) and q.stop == ["x", "y"]


def test_chat_template_content_format(llm):
    """vLLM's chat_template_content_format: OpenAI's lists of text parts are joined for a template that takes
    strings ("auto", "string"), and strings become parts for one that iterates them ("openai"); other parts and
    formats are named."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "bc"}]}]
    plain = [{"role": "user", "content": "abc"}]
    strings = "{{ messages[0]['content'] }}"
    iterated = "{% for p in messages[0]['content'] %}{{ p['text'] }}{% endfor %}"
    want = llm.chat(plain, GREEDY, use_tqdm=False, chat_template=strings)[0]
    for messages, template, fmt in [(parts, strings, "auto"), (parts, strings, "string"), (plain, iterated, "openai"),
                                    (parts, iterated, "openai")]:
        out = llm.chat(messages, GREEDY, use_tqdm=False, chat_template=template, chat_template_content_format=fmt)[0]
        assert out.prompt == want.prompt == "abc" and out.outputs[0].token_ids == want.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\]: only text parts"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], GREEDY)
    with pytest.raises(ValueError, match="chat_template_content_format must be one of"):
        llm.chat(plain, GREEDY, chat_template_content_format="xml")


def test_get_metrics_reads_as_vllms_spec_decode_example(llm, tmp_path):
    """vLLM's offline speculative-decoding example sums these Metric objects by name; the same numbers as
    stats(), which the list also reads by jaxspec's names. Without a head there are no spec_decode metrics. The
    prompt / generation token and request counters count the finished requests."""
    from jaxspec.metrics_reader import Counter, Gauge, Vector
    from tests.tiny import write_random_head

    spec = {"method": "eagle", "model": str(write_random_head(tmp_path / "head")), "num_speculative_tokens": 3}
    eagle = make_llm(tiny_weights(), llm.get_tokenizer().name_or_path, speculative_config=spec)
    outs = eagle.generate(["hello", "abc"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                          use_tqdm=False)
    metrics = eagle.get_metrics()
    num_drafts = num_draft_tokens = num_accepted_tokens = 0
    acceptance_counts = [0] * 3
    for metric in metrics:  # as vllm/examples/offline_inference/spec_decode.py reads them
        if metric.name == "vllm:spec_decode_num_drafts":
            assert isinstance(metric, Counter)
            num_drafts += metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            assert isinstance(metric, Counter)
            num_draft_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            assert isinstance(metric, Counter)
            num_accepted_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            assert isinstance(metric, Vector)
            for pos in range(len(metric.values)):
                acceptance_counts[pos] += metric.values[pos]
    stats = eagle.stats()
    assert num_drafts == stats["num_drafts"] > 0 and num_draft_tokens == stats["num_draft_tokens"]
    assert num_accepted_tokens == stats["num_accepted_tokens"] == sum(acceptance_counts)
    assert metrics["mean_acceptance_length"] == stats["mean_acceptance_length"] == 1 + num_accepted_tokens / num_drafts
    running = next(m for m in metrics if m.name == "vllm:num_requests_running")
    assert isinstance(running, Gauge) and running.value == 0 and running.labels == {"model_name": "", "engine": "0"}
    assert not [m for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode")]
    value = {(m.name, m.labels.get("finished_reason")): m.value for m in metrics if isinstance(m, Counter)}
    assert value["vllm:prompt_tokens", None] == sum(len(o.prompt_token_ids) for o in outs)
    assert value["vllm:generation_tokens", None] == 24 and value["vllm:request_success", "length"] == 2
    assert value["vllm:request_success", "stop"] == 0


def test_get_metrics_has_vllms_request_histograms(llm):
    """vLLM's offline list has the request latency and size histograms: one observation per finished request, the
    sums those of the requests' own RequestOutput.metrics and token counts, buckets cumulative up to "+Inf"."""
    from jaxspec.metrics_reader import Histogram

    before = {m.name: m for m in llm.get_metrics() if isinstance(m, Histogram)}
    outs = llm.generate(["hello", "abc", "xyz"], [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                                                  for n in (3, 7, 1)], use_tqdm=False)
    after = {m.name: m for m in llm.get_metrics() if isinstance(m, Histogram)}
    assert set(after) >= {"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                          "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                          "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                          "vllm:request_time_per_output_token_seconds", "vllm:request_prompt_tokens",
                          "vllm:request_generation_tokens"}
    added = {name: (h.count - before[name].count, h.sum - before[name].sum) for name, h in after.items()}
    ms = [o.metrics for o in outs]
    expected = {
        "vllm:time_to_first_token_seconds": [m.first_token_time - m.arrival_time for m in ms],
        "vllm:e2e_request_latency_seconds": [m.finished_time - m.arrival_time for m in ms],
        "vllm:request_queue_time_seconds": [m.first_scheduled_time - m.arrival_time for m in ms],
        "vllm:request_prefill_time_seconds": [m.first_token_time - m.first_scheduled_time for m in ms],
        "vllm:request_decode_time_seconds": [m.last_token_time - m.first_token_time for m in ms],
        "vllm:request_inference_time_seconds": [m.last_token_time - m.first_scheduled_time for m in ms],
        "vllm:request_time_per_output_token_seconds": [(m.last_token_time - m.first_token_time) / (n - 1)
                                                       for m, n in zip(ms, (3, 7, 1)) if n > 1],
        "vllm:request_prompt_tokens": [len(o.prompt_token_ids) for o in outs],
        "vllm:request_generation_tokens": [3, 7, 1]}
    for name, values in expected.items():
        count, total = added[name]
        assert count == len(values) and total == pytest.approx(sum(values), rel=1e-9, abs=1e-9), name
        assert all(v >= 0 for v in values), name
    for h in after.values():
        counts = list(h.buckets.values())
        assert counts == sorted(counts) and list(h.buckets)[-1] == "+Inf" and counts[-1] == h.count, h.name
    assert after["vllm:request_generation_tokens"].buckets["5.0"] - before["vllm:request_generation_tokens"].buckets[
        "5.0"] == 2  # 3 and 1 at or below 5, 7 above


def test_histogram_buckets_follow_prometheus_le():
    """A value equal to a bound counts in that bound's bucket (Prometheus's `le`), one above every bound only in
    "+Inf"."""
    from jaxspec.engine.request_histograms import BucketCounts

    h = BucketCounts([1, 2.5])
    for v in (0.5, 1, 1.0001, 2.5, 3):
        h.observe(v)
    assert h.cumulative() == {"1.0": 2, "2.5": 4, "+Inf": 5} and h.count == 5 and h.sum == pytest.approx(8.0001)
