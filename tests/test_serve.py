"""`jaxspec serve` on a tiny model: a real uvicorn server on 127.0.0.1, called with the official `openai` client
and raw httpx; the oracle is `LLM.generate` / `LLM.chat` on the same LLM before the server takes it over."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import multiprocessing
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import openai
import pytest
import uvicorn

from jaxspec import BeamSearchParams, SamplingParams
from jaxspec.bench import serve as bench_serve
from jaxspec.serve.app import build_app
from jaxspec.serve.engine_process import EngineProcess
from tests.numerics import FP32_EPS, assert_close_scaled
from tests.tiny import TINY, logprobs_reference, make_llm, tiny_weights, write_char_tokenizer

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny-chat"
MAX_TOKENS = 12
MAX_MODEL_LEN = 256
PROMPTS = ["abc", "hello", "xyz", "jaxspec", "q", "abcdefghij", "ABC", "mixedCASE"] * 2
CHATS = [[{"role": "user", "content": "hi"}], [{"role": "system", "content": "be"}, {"role": "user", "content": "x"}]]
# a template of characters in the char tokenizer's vocabulary: roles' initials, contents, then "Z" for the reply
TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}Z" \
           "{% endif %}"
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
# vLLM's chat template options: a conversation whose last (assistant) message the model continues, or that ends
# without the generation prompt
CONTINUED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ab"}]
CHAT_OPTIONS = [{}, {"continue_final_message": True}]


def make_model_dir(path):
    write_char_tokenizer(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": TEMPLATE}))
    return path


@contextmanager
def running(app):
    """A uvicorn server in a thread, on a free port of 127.0.0.1; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


def tiny_chat_llm(path: str):
    """The served LLM: a long context, so that a request can outlast its client's disconnect (a CPU step takes
    about a millisecond). Importable, for the engine process to build its own copy."""
    return make_llm(tiny_weights(), Path(path), max_model_len=MAX_MODEL_LEN, max_num_seqs=16, decode_buckets=[16],
                    prefill_buckets=[64])


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """The LLM of this process and what it generates (before any server runs it)."""
    path = make_model_dir(tmp_path_factory.mktemp("tinychat"))
    llm = tiny_chat_llm(str(path))
    reference = {p: o.outputs[0].text for p, o in zip(PROMPTS, llm.generate(PROMPTS, GREEDY, use_tqdm=False))}
    chat_reference = [o.outputs[0].text for o in llm.chat(CHATS, GREEDY, use_tqdm=False)]
    options_reference = [llm.chat(CONTINUED, GREEDY, use_tqdm=False, add_generation_prompt=False, **kw)[0]
                         for kw in CHAT_OPTIONS]
    ids_reference = llm.generate([[3, 1, 4, 1, 5]], GREEDY, use_tqdm=False)[0].outputs[0].text
    beams = llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=3, max_tokens=MAX_TOKENS))
    return SimpleNamespace(llm=llm, path=path, reference=reference, chat_reference=chat_reference,
                           options_reference=options_reference, ids_reference=ids_reference, beams=beams)


@pytest.fixture(scope="module", params=["process", "thread"])
def served(request, oracle):
    """A server of the same model with its engine in a process of its own (`jaxspec serve`'s default), then one
    with the engine on a thread of this process running the oracle's LLM (--disable-frontend-multiprocessing)."""
    if request.param == "process":
        engine = EngineProcess.launch(functools.partial(tiny_chat_llm, str(oracle.path)))
    else:
        engine = oracle.llm
    app = build_app(engine, served_model_name=[MODEL, "alias"], api_key=API_KEY, model_path=str(oracle.path))
    with running(app) as url:
        yield SimpleNamespace(**vars(oracle), url=url, app=app,
                              client=openai.OpenAI(base_url=url + "/v1", api_key=API_KEY))


def async_client(served) -> openai.AsyncOpenAI:
    """A client for one asyncio.run (its connection pool belongs to that run's event loop)."""
    return openai.AsyncOpenAI(base_url=served.url + "/v1", api_key=API_KEY)


def scrape(url: str) -> dict[str, float]:
    """/metrics as {name{labels}: value}."""
    text = httpx.get(url + "/metrics", headers=AUTH).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def metric(values: dict, name: str, **labels) -> float:
    want = {f'{k}="{v}"' for k, v in labels.items()}
    found = [v for key, v in values.items() if key.split("{")[0] == name
             and want <= set(key[key.find("{") + 1:-1].split(",") if "{" in key else [])]
    assert found, f"{name} {labels} not in /metrics"
    return sum(found)


def wait_until_idle(url: str, timeout: float = 30) -> dict:
    """/metrics once every page is back in the pool and nothing runs or waits."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        idle = (metric(m, "jaxspec:num_free_kv_pages") == metric(m, "jaxspec:num_kv_pages")
                and metric(m, "vllm:num_requests_running") == 0 and metric(m, "vllm:num_requests_waiting") == 0)
        if idle:
            return m
        assert time.monotonic() < deadline, f"pages never came back: {m}"
        time.sleep(0.05)


def post(served, path: str, body: dict, key: str | None = API_KEY, timeout: float = 30) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(served.url + path, json=body, headers=headers, timeout=timeout)


def stream_events(served, body: dict, timeout: float = 30) -> list[str]:
    """The data of each server-sent event of a streamed completion, [DONE] included."""
    with httpx.stream("POST", served.url + "/v1/completions", json=body | {"stream": True}, timeout=timeout,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


# ---- the OpenAI API with the openai client

@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_generate(served, stream):
    prompt = PROMPTS[1]
    kw = dict(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    if stream:
        chunks = list(served.client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        usage = chunks[-1].usage
        assert not chunks[-1].choices and all(c.usage is None for c in chunks[:-1])
        assert len([c for c in chunks if c.choices]) > 1  # really streamed, not one chunk at the end
    else:
        out = served.client.completions.create(**kw)
        text, finish, usage = out.choices[0].text, out.choices[0].finish_reason, out.usage
        assert out.model == MODEL and out.id.startswith("cmpl-")
    assert text == served.reference[prompt]
    assert finish == "length"
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        len(prompt), MAX_TOKENS, len(prompt) + MAX_TOKENS)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_llm_chat(served, stream):
    for messages, want in zip(CHATS, served.chat_reference):
        kw = dict(model="alias", messages=messages, max_completion_tokens=MAX_TOKENS, temperature=0,
                  extra_body={"ignore_eos": True})
        if stream:
            chunks = list(served.client.chat.completions.create(stream=True, **kw))
            assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            assert chunks[-1].choices[0].finish_reason == "length"
            assert chunks[0].object == "chat.completion.chunk" and chunks[0].model == MODEL
        else:
            out = served.client.chat.completions.create(**kw)
            text = out.choices[0].message.content
            assert out.choices[0].message.role == "assistant" and out.choices[0].finish_reason == "length"
            rendered = "".join(m["role"][0] + m["content"] for m in messages) + "Z"
            assert out.usage.prompt_tokens == len(rendered) and out.usage.completion_tokens == MAX_TOKENS
        assert text == want


def test_chat_template_options_reach_the_template(served):
    """add_generation_prompt, continue_final_message, chat_template and chat_template_kwargs (vLLM's LLM.chat
    options) shape the prompt; the server's request fields give what LLM.chat gives."""
    for kw, ref in zip(CHAT_OPTIONS, served.options_reference):
        assert ref.prompt == "uhiaab"  # no "Z": the reply continues the assistant's "ab" (TEMPLATE has no turn end)
        out = served.client.chat.completions.create(
            model=MODEL, messages=CONTINUED, max_completion_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True, "add_generation_prompt": False, **kw})
        assert out.choices[0].message.content == ref.outputs[0].text and out.usage.prompt_tokens == len("uhiaab")
    tok = served.llm.get_tokenizer()
    custom = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    want = tok.apply_chat_template(CONTINUED, tokenize=False, chat_template=custom, greeting="yo")
    assert want == "yohiab"
    from jaxspec.chat import render_chat

    assert render_chat(tok, CONTINUED, chat_template=custom, chat_template_kwargs={"greeting": "yo"}) == want
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt"):
        served.llm.chat(CONTINUED, GREEDY, continue_final_message=True)
    with pytest.raises(ValueError, match=r"chat_template_kwargs may not set \['tools'\]"):
        served.llm.chat(CONTINUED, GREEDY, chat_template_kwargs={"tools": []})


def test_token_ids_and_batched_prompts(served):
    out = served.client.completions.create(model=MODEL, prompt=[3, 1, 4, 1, 5], max_tokens=MAX_TOKENS,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].text == served.ids_reference and out.usage.prompt_tokens == 5
    out = served.client.completions.create(model=MODEL, prompt=[9, 9, 3, 1, 4, 1, 5], max_tokens=MAX_TOKENS,
                                           temperature=0, extra_body={"ignore_eos": True, "truncate_prompt_tokens": 5})
    assert out.choices[0].text == served.ids_reference and out.usage.prompt_tokens == 5
    batch = PROMPTS[:3]
    out = served.client.completions.create(model=MODEL, prompt=batch, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [served.reference[p] for p in batch]
    assert out.usage.prompt_tokens == sum(map(len, batch)) and out.usage.completion_tokens == 3 * MAX_TOKENS


def test_stop_string_and_max_tokens(served):
    want = served.reference[PROMPTS[0]]
    stop = want[4:6]
    out = served.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                           stop=[stop], extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == want[:want.find(stop)]
    out = served.client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3, temperature=0)
    assert out.choices[0].text == want[:3] and out.usage.completion_tokens == 3


def test_models_health_metrics(served):
    models = served.client.models.list()
    assert [m.id for m in models.data] == [MODEL, "alias"]
    assert httpx.get(served.url + "/health", headers=AUTH).status_code == 200
    before = scrape(served.url)
    served.client.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    after = wait_until_idle(served.url)
    delta = lambda name, **kw: metric(after, name, **kw) - metric(before, name, **kw)  # noqa: E731
    assert delta("vllm:generation_tokens_total", model_name=MODEL) == 5
    assert delta("vllm:prompt_tokens_total", model_name=MODEL) == 3
    # the prefix cache looked the prompt up; 3 tokens fill no page, so it found none
    assert (delta("vllm:prefix_cache_queries_total"), delta("vllm:prefix_cache_hits_total")) == (3, 0)
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") >= 1
    for phase in ("queue", "prefill", "decode", "inference"):  # the engine's RequestMetrics of the output
        assert delta(f"vllm:request_{phase}_time_seconds_count") == 1, phase
    assert metric(after, "vllm:kv_cache_usage_perc") == 0


def test_sixteen_concurrent_streams(served):
    async def one(client, prompt):
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def main():
        async with async_client(served) as client:
            return await asyncio.gather(*(one(client, p) for p in PROMPTS))

    assert len(PROMPTS) == 16
    assert asyncio.run(main()) == [served.reference[p] for p in PROMPTS]


def test_disconnect_mid_stream_frees_pages(served):
    before = wait_until_idle(served.url)
    stream = served.client.completions.create(model=MODEL, prompt="ab", max_tokens=MAX_MODEL_LEN - 2, temperature=0,
                                              stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()  # the client goes away with hundreds of tokens to go
    after = wait_until_idle(served.url)
    assert metric(after, "vllm:request_success_total", finished_reason="abort") == \
        metric(before, "vllm:request_success_total", finished_reason="abort") + 1
    assert metric(after, "vllm:generation_tokens_total") - metric(before, "vllm:generation_tokens_total") < \
        MAX_MODEL_LEN - 2


def test_disconnect_before_a_non_streaming_response_frees_pages(served):
    before = wait_until_idle(served.url)
    body = json.dumps({"model": MODEL, "prompt": "ab", "max_tokens": MAX_MODEL_LEN - 2, "ignore_eos": True}).encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:  # raw, so that it can hang up at the right moment
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body)
        first = "vllm:time_to_first_token_seconds_count"
        while metric(scrape(served.url), first) == metric(before, first):  # until it is generating
            time.sleep(0.002)
    after = wait_until_idle(served.url)
    assert metric(after, "vllm:request_success_total", finished_reason="abort") == \
        metric(before, "vllm:request_success_total", finished_reason="abort") + 1


# ---- errors

BAD_REQUESTS = [  # (path, body, status, param)
    ("/v1/completions", {"model": MODEL, "prompt": "a" * MAX_MODEL_LEN}, 400, None),  # no room left to generate
    ("/v1/completions", {"model": MODEL, "prompt": [1] * (MAX_MODEL_LEN + 1)}, 400, None),
    ("/v1/completions", '{"model": "tiny-chat", "prompt": ', 400, None),  # malformed JSON
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [1.5, 2]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "prompt"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "a"}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "top_p": 2}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 999]}, 400, None),  # a token id outside the vocabulary
    ("/v1/completions", {"model": MODEL, "prompt": "a", "suffix": "b"}, 400, "suffix"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "use_beam_search": True, "n": 11}, 400, "n"),  # > 20 / 2
    ("/v1/completions", {"model": MODEL, "prompt": "a", "use_beam_search": True, "guided_regex": "a+"}, 400,
     "use_beam_search"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                              "tools": [{"type": "function"}]}, 400, "tool_choice"),  # no --enable-auto-tool-choice
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                              "tools": [{"type": "function"}], "tool_choice": "required"}, 400, "tools"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                              "response_format": {"type": "xml"}}, 400, "response_format"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                              "continue_final_message": True}, 400, "continue_final_message"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                              "chat_template_kwargs": {"add_generation_prompt": False}}, 400, "chat_template_kwargs"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}],
                              "chat_template": "{{ messages }}"}, 400, "chat_template"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "a"}]}, 404, "model"),
]


def test_bad_requests_get_openai_errors_and_others_are_unaffected(served):
    async def good():
        async with async_client(served) as client:
            stream = await client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True, extra_body={"ignore_eos": True})
            return "".join([c.choices[0].text async for c in stream if c.choices])

    async def bad():
        async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
            return [await c.post(path, content=body if isinstance(body, str) else json.dumps(body),
                                 headers={"Content-Type": "application/json"})
                    for path, body, _, _ in BAD_REQUESTS]

    async def main():
        return await asyncio.gather(good(), bad())

    text, responses = asyncio.run(main())
    assert text == served.reference[PROMPTS[2]]
    for (path, body, status, param), r in zip(BAD_REQUESTS, responses):
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status, r.text
        assert error["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]
        assert error["message"], body
        if param is not None:
            assert error["param"] == param, (body, error)
    wait_until_idle(served.url)


@pytest.mark.parametrize("field,value", [("n", 2), ("logprobs", 2), ("presence_penalty", 0.5),
                                         ("repetition_penalty", 1.3), ("min_tokens", 3)])
def test_sampling_fields_follow_sampling_params(served, field, value):
    """A field SamplingParams lacks is refused by name; one it has reaches it (n and logprobs, once they exist)."""
    from dataclasses import fields
    r = post(served, "/v1/completions", {"model": MODEL, "prompt": "ab", "max_tokens": 4, field: value})
    if field in {f.name for f in fields(SamplingParams)}:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert field in r.json()["error"]["message"]


def test_tokenize_detokenize_version(served):
    """vLLM's /tokenize (a text as the completions API tokenizes it; a conversation as the chat API does: its
    count is the chat usage's prompt_tokens), /detokenize and /version; bad ids and models are 400 / 404."""
    tok = served.llm.get_tokenizer()
    r = post(served, "/tokenize", {"model": MODEL, "prompt": "abcXY", "return_token_strs": True}).json()
    assert r == {"count": 5, "max_model_len": MAX_MODEL_LEN, "tokens": tok.encode("abcXY"),
                 "token_strs": list("abcXY")}
    chat = post(served, "/tokenize", {"messages": CHATS[1]}).json()
    usage = post(served, "/v1/chat/completions", {"model": MODEL, "messages": CHATS[1], "max_tokens": 1}).json()
    assert chat["count"] == usage["usage"]["prompt_tokens"] and chat["token_strs"] is None
    assert post(served, "/detokenize", {"tokens": r["tokens"]}).json() == {"prompt": "abcXY"}
    assert post(served, "/detokenize", {"tokens": [1, 10**6]}).json()["error"]["param"] == "tokens"
    assert post(served, "/tokenize", {"model": "nope", "prompt": "a"}).status_code == 404
    assert post(served, "/tokenize", {"model": MODEL}).status_code == 400  # neither prompt nor messages
    version = httpx.get(served.url + "/version", headers=AUTH).json()
    assert version["version"]


def test_api_key(served):
    for key in (None, "wrong"):
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = post(served, path, {"model": MODEL, "prompt": "a"}, key=key)
            assert r.status_code == 401 and r.json()["error"]["code"] == 401
        assert httpx.get(served.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401
        for path in ("/tokenize", "/detokenize"):  # every route, those vLLM leaves open included
            assert post(served, path, {"prompt": "a", "tokens": [1]}, key=key).status_code == 401
        for path in ("/version", "/health", "/metrics"):
            r = httpx.get(served.url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
            assert r.status_code == 401 and r.json()["error"]["code"] == 401, path
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.url + "/v1", api_key="wrong").models.list()
    for path in ("/version", "/health", "/metrics"):
        assert httpx.get(served.url + path, headers=AUTH).status_code == 200, path


# ---- soak

def test_soak_500_requests_with_disconnects(served):
    """500 streamed requests arriving at ~250/s, every tenth dropped after its first chunk: the rest complete with
    their exact usage, and afterwards every page is free and /health is OK."""
    n, max_tokens = 500, 6
    arrivals = np.cumsum(np.random.default_rng(0).exponential(1 / 250, n))  # a Poisson process at 250/s

    async def one(client, i):
        await asyncio.sleep(float(arrivals[i]))
        body = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            if i % 10 == 0:
                await anext(lines)
                return None  # leaving the block closes the connection mid-stream
            events = [line[6:] async for line in lines if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return json.loads(events[-2])["usage"]["completion_tokens"]

    async def main():
        # idle connections are dropped before uvicorn's 5 s keep-alive timeout would close them under a request
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2)
        async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {API_KEY}"},
                                     limits=limits, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(n)))

    start = time.monotonic()
    usage = asyncio.run(main())
    assert [u for i, u in enumerate(usage) if i % 10] == [max_tokens] * (n - n // 10)
    wait_until_idle(served.url)
    assert httpx.get(served.url + "/health", headers=AUTH).status_code == 200
    print(f"soak: {n} requests in {time.monotonic() - start:.1f} s")


# ---- the engine process

def test_a_dead_engine_process_fails_its_requests_and_health(oracle):
    """A SIGINT (Ctrl-C reaches the whole process group) leaves the engine process serving; killed under a
    stream, the stream ends with an error event, /health says 503, and a new request gets a 500 JSON error."""
    engine = EngineProcess.launch(functools.partial(tiny_chat_llm, str(oracle.path)))
    with running(build_app(engine, served_model_name=MODEL, api_key=API_KEY)) as url:
        served = SimpleNamespace(url=url)
        os.kill(engine.pid, signal.SIGINT)
        r = post(served, "/v1/completions", {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS,
                                             "temperature": 0, "ignore_eos": True})
        assert r.json()["choices"][0]["text"] == oracle.reference[PROMPTS[0]]
        assert httpx.get(url + "/health", headers=AUTH).status_code == 200
        body = {"model": MODEL, "prompt": "ab", "max_tokens": MAX_MODEL_LEN - 2, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30,
                          headers=AUTH) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            os.kill(engine.pid, signal.SIGKILL)
            events = [line[6:] for line in lines if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and "the engine process exited" in json.loads(events[-2])["error"]["message"]
        assert httpx.get(url + "/health", headers=AUTH).status_code == 503
        r = post(served, "/v1/completions", {"model": MODEL, "prompt": "ab", "max_tokens": 2})
        assert r.status_code == 500 and r.json()["error"]["code"] == 500, r.text


def test_the_engine_snapshots_its_counters_before_the_outputs_that_leave_it_idle(oracle):
    """When a step's outputs leave the engine idle, the metrics snapshot goes out before them: a client that has its
    last token and then reads /metrics (`jaxspec bench serve`) sees every step of its run counted (the snapshot
    after them once lost the run's last steps to that race)."""
    import queue

    from jaxspec.serve.engine_core import Add, EngineCore, Stop

    llm = tiny_chat_llm(str(oracle.path))  # its own: the thread server's engine runs the oracle's
    commands, events, ids = queue.SimpleQueue(), [], [f"r{i}" for i in range(3)]
    finished = set()

    def emit(event):
        events.append(event)
        if event[0] == "outputs":
            finished.update(o.request_id for o in event[1] if o.finished)
            if finished == set(ids):
                commands.put(Stop())

    commands.put(Add(0, [(rid, {"prompt_token_ids": [3, 1, 4][:i + 1]},
                          SamplingParams(temperature=0, max_tokens=4 + 3 * i, ignore_eos=True))
                         for i, rid in enumerate(ids)]))
    EngineCore(llm, commands, emit, snapshot_interval_s=1e9).run()  # no periodic snapshots
    last = max(i for i, e in enumerate(events) if e[0] == "outputs")
    assert events[last - 1][0] == "metrics" and events[last + 1][0] == "metrics"
    assert events[last - 1][1]["num_steps"] == llm.stats()["num_steps"] >= 4 + 3 * (len(ids) - 1)


def test_the_events_reader_leaves_the_event_loop_its_turn(monkeypatch):
    """However many events wait in the pipe, one wake-up routes at most MAX_EVENTS_PER_WAKEUP of them, so that the
    streams' tasks run in between; the next wake-ups take the rest, in order."""
    from jaxspec.serve import engine_process

    n = 4
    monkeypatch.setattr(engine_process, "MAX_EVENTS_PER_WAKEUP", n)
    recv, send = multiprocessing.Pipe(duplex=False)
    engine = EngineProcess(None, None, recv, {"tokenizer": None, "max_model_len": 8, "default_sampling_values": {},
                                              "metrics": {}})
    for i in range(10):
        send.send(("metrics", {"i": i}))
    seen = []
    for _ in range(3):
        engine._read()
        seen.append(engine.metrics["i"])
    assert seen == [n - 1, min(2 * n, 10) - 1, min(3 * n, 10) - 1]


def test_the_events_reader_merges_waiting_steps():
    """Steps' outputs that wait in the pipe together reach the server as one (wire.merge), in order with the other
    events: here three steps, a metrics snapshot, then two more."""
    recv, send = multiprocessing.Pipe(duplex=False)
    engine = EngineProcess(None, None, recv, {"tokenizer": None, "max_model_len": 8, "default_sampling_values": {},
                                              "metrics": {}})
    seen = []
    engine._on_event = seen.append

    def row(rid, tokens, finished=False):
        return (rid, ("p", [1]), None, [(0, "", tokens, None, ("list", None), "length" if finished else None, None)],
                finished, None, 0)

    for event in [("outputs", [row("a", [1]), row("b", [2])], 1.0), ("outputs", [row("a", [3])], 2.0),
                  ("outputs", [row("b", [4], True)], 3.0), ("metrics", {"i": 0}), ("outputs", [row("a", [5])], 4.0),
                  ("outputs", [row("a", [6], True)], 5.0)]:
        send.send(event)
    engine._read()
    assert [e[0] for e in seen] == ["outputs", "metrics", "outputs"] and (seen[0][2], seen[2][2]) == (3.0, 5.0)
    assert [(o.request_id, o.outputs[0].token_ids, o.finished) for o in seen[0][1]] == [("a", [1, 3], False),
                                                                                       ("b", [2, 4], True)]
    assert [(o.request_id, o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in seen[2][1]] == [
        ("a", [5, 6], "length")]


def test_wire_round_trip_gives_the_same_outputs(oracle):
    """What the engine process sends is what the server rebuilds: several steps of one request, its prompt with
    the first only, logprobs made in the server with its own tokenizer, prompt logprobs, metrics."""
    from jaxspec.engine.logprob_output import FlatLogprobs
    from jaxspec.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
    from jaxspec.serve.wire import Decoder, Encoder

    tok = oracle.llm.get_tokenizer()
    rows = np.array([[np.float32(-0.5).view(np.int32), 1, np.float32(-0.5).view(np.int32), 3],
                     [np.float32(-1.25).view(np.int32), 2, np.float32(-0.25).view(np.int32), 7]], np.int32)
    text = functools.lru_cache(maxsize=None)(lambda t: tok.decode([t]))

    def step(i, finished):
        comp = CompletionOutput(0, f"t{i}", [3, 4], -1.75, FlatLogprobs([3, 4], rows, 1, text),
                                "length" if finished else None, None)
        plain = CompletionOutput(1, "", [], None, None, None, None)
        return RequestOutput("r", "ab", [1, 2, 3], [None, {2: Logprob(-0.1, 1, "b")}] if i == 0 else None,
                             [comp, plain], finished, RequestMetrics(1.0, 2.0, 1.5, 2.0, 0.5, None), 0)

    encoder, decoder = Encoder(), Decoder(tok)
    steps = [[step(0, False)], [step(1, False)], [step(2, True)]]
    wire = [pickle.loads(pickle.dumps(encoder.encode(s))) for s in steps]
    assert wire[0][0][1] == ("ab", [1, 2, 3]) and wire[1][0][1] is None
    decoded = [decoder.decode(w) for w in wire]
    assert decoded == steps
    assert decoded[1][0].outputs[0].logprobs[1][7] == Logprob(-0.25, 1, text(7))
    assert not decoder._prompts  # nothing kept once the request has finished


def test_text_made_in_the_server_equals_the_engines(tmp_path):
    """Requests without stop strings run with detokenize=False and get their text from the server's Decoder:
    step for step the same outputs as the engine's own text, over a byte-level tokenizer whose characters span
    tokens (seeded sampling makes invalid and split UTF-8), two samples of one prompt, and each finish; and with
    the steps merged as a server that fell behind reads them, the same for each request."""
    from jaxspec.sampling_params import RequestOutputKind
    from jaxspec.serve.wire import Decoder, Encoder, merge
    from tests.tiny import TINY, write_byte_tokenizer

    cfg = dataclasses.replace(TINY, vocab_size=256)
    llm = make_llm(tiny_weights(cfg=cfg), write_byte_tokenizer(tmp_path / "bytes"), cfg=cfg, decode_buckets=[8])
    engine, prompts = llm.llm_engine, [[104, 105], [200, 201, 202], [65]]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=24 + i, n=2 if i == 1 else 1,
                             output_kind=RequestOutputKind.DELTA, logprobs=1 if i == 2 else None) for i in range(3)]

    def steps(make_params, convert):
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request(str(i), {"prompt_token_ids": prompt}, make_params(str(i), p))
        out = []
        while engine.has_unfinished_requests():
            out.append([(o.request_id, [(c.index, c.text, c.token_ids, c.finish_reason, c.logprobs and list(c.logprobs))
                                        for c in o.outputs], o.finished) for o in convert(engine.step())])
        return out

    decoder, encoder = Decoder(llm.get_tokenizer()), Encoder()
    own = steps(lambda rid, p: p, lambda outs: outs)
    made = steps(decoder.engine_params, lambda outs: decoder.decode(pickle.loads(pickle.dumps(encoder.encode(outs)))))
    assert made == own
    assert any("\ufffd" in text or ord(max(text or "a")) > 127 for step in own for _, comps, _ in step
               for _, text, _, _, _ in comps)  # multi-byte characters did occur
    assert not decoder._texts and not decoder._prompts
    assert decoder.engine_params("s", SamplingParams(stop=["x"])).detokenize  # stop strings: the engine's text

    # steps merged as a server that fell behind reads them (runs of 1, 2, 3, ... steps): per request and sample the
    # same tokens, text, logprobs and finish as every step read alone
    def concatenated(step_lists):
        total = {}
        for step in step_lists:
            for rid, comps, finished in step:
                for index, text, token_ids, reason, logprobs in comps:
                    t = total.setdefault((rid, index), ["", [], None, []])
                    t[0] += text
                    t[1] += token_ids
                    t[2] = reason
                    t[3] += logprobs or []
        return total

    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, decoder.engine_params(str(i), p))
    wires = []
    while engine.has_unfinished_requests():
        wires.append(pickle.loads(pickle.dumps(encoder.encode(engine.step()))))
    runs, at, size = [], 0, 1
    while at < len(wires):
        batch = wires[at]
        for w in wires[at + 1:at + size]:
            batch = merge(batch, w)
        runs.append(batch)
        at, size = at + size, size + 1
    assert len(runs) < len(wires) - 2
    as_read = [[(o.request_id, [(c.index, c.text, c.token_ids, c.finish_reason, c.logprobs and list(c.logprobs))
                                for c in o.outputs], o.finished) for o in decoder.decode(r)] for r in runs]
    assert concatenated(as_read) == concatenated(own)
    assert not decoder._texts and not decoder._prompts


# ---- the benchmark client against the server

def bench_args(served, tmp_path, **kw):
    args = dict(base_url=served.url, endpoint="/v1/completions", model=None, api_key=API_KEY,
                dataset_name="random", dataset_path=None, jsonl_output_len=8, random_input_len=6,
                random_output_len=5, tokenizer=str(served.path), num_prompts=6, seed=0, request_rate=float("inf"),
                burstiness=1.0, max_concurrency=None, temperature=0.0, ignore_eos=True, disable_tqdm=True,
                save_result=True, result_dir=str(tmp_path), result_filename=None, label=None, compare_with=None)
    return SimpleNamespace(**(args | kw))


def test_bench_serve_random_completions(served, tmp_path):
    result = bench_serve.run(bench_args(served, tmp_path, request_rate=50.0, max_concurrency=4))
    assert result["completed"] == 6 and result["failed"] == 0 and result["model_id"] == MODEL
    assert result["input_lens"] == [6] * 6 and result["output_lens"] == [5] * 6
    assert result["total_output_tokens"] == 30
    assert all(t > 0 for t in result["ttfts"]) and all(len(x) >= 1 for x in result["itls"])
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert all(f"{s}_{name}_ms" in result for s in ("mean", "median", "p90", "p99"))
    assert result["mean_acceptance_length"] is None  # no draft head
    # the engine's timing over the run: 30 tokens, at most 4 requests a step, one token each
    assert 8 <= result["engine_steps"] <= 40
    assert 0 <= result["engine_host_wait_ms"] <= result["engine_step_ms"] and result["engine_emit_ms"] >= 0
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert saved["generated_texts"] == result["generated_texts"] and saved["command"]
    assert all(len(t) == 5 for t in result["generated_texts"])  # one character per token


def test_bench_serve_jsonl_chat_compare(served, tmp_path):
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "x"}) + "\n" for q in ("abc", "defg", "hij")))
    kw = dict(endpoint="/v1/chat/completions", dataset_name="jsonl", dataset_path=str(data), num_prompts=4)
    first = bench_serve.run(bench_args(served, tmp_path, result_filename="a.json", **kw))
    second = bench_serve.run(bench_args(served, tmp_path, result_filename="b.json",
                                        compare_with=str(tmp_path / "a.json"), **kw))
    assert first["completed"] == 4 and first["input_lens"] == [5, 6, 5, 5]  # "u" + question + "Z"
    assert second["compare"]["identical"] == 4 and not second["compare"]["mismatches"]
    assert first["generated_texts"][0] == first["generated_texts"][3]  # the file is cycled


# ---- echo: scoring a text as lm-eval and OpenAI's clients do

SCORED = "helloWorldαβ"


def completion_logprobs(served, body: dict, stream: bool) -> tuple[str, dict, dict]:
    """(text, logprobs, the last choice or chunk) of one completion; streamed chunks joined into one."""
    body = {"model": MODEL, "temperature": 0, **body}
    if not stream:
        choice = post(served, "/v1/completions", body).json()["choices"][0]
        return choice["text"], choice["logprobs"], choice
    choices = [json.loads(e)["choices"][0] for e in stream_events(served, body) if e.startswith("{")]
    joined = {key: [v for c in choices if c["logprobs"] for v in c["logprobs"][key]]
              for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    return "".join(c["text"] for c in choices), joined, choices[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_echo_scores_the_prompt_as_lm_eval_does(served, stream):
    """lm-eval's loglikelihood request (token ids, echo, max_tokens 1, logprobs 1): the prompt's tokens come back
    with their logprobs (the first None), equal to a full-sequence forward of the model, each position's top
    alternatives holding the greedy one, then the generated token; offsets run through the whole text."""
    tok = served.llm.get_tokenizer()
    ids = tok.encode(SCORED)
    text, lp, last = completion_logprobs(served, {"prompt": ids, "max_tokens": 1, "logprobs": 1, "echo": True},
                                         stream)
    want = logprobs_reference(tiny_weights(), TINY, ids)
    best_two = np.sort(want, -1)[:, -2:]
    assert (best_two[:, 1] - best_two[:, 0]).min() > 1e-4, "a near tie for the greedy token (another CPU may flip it)"
    generated = tok.decode([int(np.argmax(want[-1]))])
    assert text == SCORED + generated and last["finish_reason"] == "length"
    assert lp["tokens"] == list(SCORED) + [generated]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    got = np.array(lp["token_logprobs"][1:])
    # fp32 logits over a 128-token vocabulary: a few dozen roundings in the engine's paged attention and sums
    assert_close_scaled(got, np.append(want[np.arange(len(ids) - 1), ids[1:]], want[-1].max()), 64 * FP32_EPS,
                        axis=None)
    for t, top in enumerate(lp["top_logprobs"][1:]):  # the token itself and the top 1 (the greedy check's input)
        assert tok.decode([int(np.argmax(want[t]))]) in top and len(top) <= 2
        assert max(top.values()) == pytest.approx(want[t].max(), abs=64 * FP32_EPS * np.abs(want[t]).max())
    assert lp["text_offset"] == list(range(len(SCORED) + 1))  # one character per token
    if not stream:  # vLLM's prompt_logprobs field beside them
        prompt_logprobs = last["prompt_logprobs"]
        assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(ids)
        assert [next(iter(d.values()))["decoded_token"] for d in prompt_logprobs[1:]] == list(SCORED[1:])


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_is_the_prompt_alone(served, stream):
    text, lp, last = completion_logprobs(served, {"prompt": SCORED, "max_tokens": 0, "logprobs": 0, "echo": True},
                                         stream)
    assert text == SCORED and lp["tokens"] == list(SCORED) and last["finish_reason"] == "length"
    assert lp["token_logprobs"][0] is None and all(v <= 0 for v in lp["token_logprobs"][1:])
    assert all(len(top) == 1 for top in lp["top_logprobs"][1:])  # logprobs 0: the token itself only
    r = post(served, "/v1/completions", {"model": MODEL, "prompt": SCORED, "max_tokens": 0, "echo": True})
    assert r.json()["choices"][0]["text"] == SCORED and r.json()["choices"][0]["logprobs"] is None


def completion_texts(served, body: dict) -> dict[int, str]:
    """Each choice's whole text, streamed (chunks joined by index) or not."""
    if not body.get("stream"):
        return {c["index"]: c["text"] for c in post(served, "/v1/completions", body).json()["choices"]}
    chunks = [json.loads(e)["choices"][0] for e in stream_events(served, body) if e.startswith("{")]
    return {i: "".join(c["text"] for c in chunks if c["index"] == i) for i in sorted({c["index"] for c in chunks})}


@pytest.mark.parametrize("stream", [False, True])
def test_echo_before_a_generated_answer(served, stream):
    """Two text prompts: each choice is its prompt and then exactly what generate gives; with n = 2 (seeded) every
    choice starts with its own prompt once."""
    body = {"model": MODEL, "prompt": PROMPTS[:2], "max_tokens": MAX_TOKENS, "temperature": 0, "echo": True,
            "ignore_eos": True, "stream": stream}
    assert completion_texts(served, body) == {i: p + served.reference[p] for i, p in enumerate(PROMPTS[:2])}
    texts = completion_texts(served, body | {"temperature": 1, "seed": 3, "n": 2})
    assert sorted(texts) == [0, 1, 2, 3]
    for i, text in texts.items():
        assert text.startswith(PROMPTS[i // 2]) and len(text) == len(PROMPTS[i // 2]) + MAX_TOKENS


@pytest.mark.parametrize("stream", [False, True])
def test_chat_echo_repeats_the_continued_message(served, stream):
    """vLLM's chat echo: an answer that continues the last message (here the assistant's, continue_final_message)
    starts with that message's text; after a generation prompt there is nothing to repeat."""
    body = {"model": MODEL, "messages": CONTINUED, "max_tokens": MAX_TOKENS, "temperature": 0, "echo": True,
            "ignore_eos": True, "add_generation_prompt": False, "continue_final_message": True}
    want = CONTINUED[-1]["content"] + served.options_reference[1].outputs[0].text
    plain = {"model": MODEL, "messages": CHATS[0], "max_tokens": MAX_TOKENS, "temperature": 0, "echo": True,
             "ignore_eos": True}
    if stream:
        for request, expected in ((body, want), (plain, served.chat_reference[0])):
            standard = {k: request[k] for k in ("model", "messages", "max_tokens", "temperature")}
            extra = {k: v for k, v in request.items() if k not in standard}  # vLLM's fields
            chunks = list(served.client.chat.completions.create(stream=True, extra_body=extra, **standard))
            assert chunks[0].choices[0].delta.role == "assistant"
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    else:
        r = post(served, "/v1/chat/completions", body).json()
        assert r["choices"][0]["message"] == {"role": "assistant", "content": want, "tool_calls": None}
        r = post(served, "/v1/chat/completions", plain).json()
        assert r["choices"][0]["message"]["content"] == served.chat_reference[0]


# ---- use_beam_search (vLLM's)

@pytest.mark.parametrize("stream", [False, True])
def test_use_beam_search_equals_llm_beam_search(served, stream):
    """n beams per prompt, best first, each a choice: the generated text and tokens of LLM.beam_search's beams,
    with their logprobs when asked; a streaming request gets the whole response as one event (as vLLM)."""
    body = {"model": MODEL, "prompt": PROMPTS[:2], "max_tokens": MAX_TOKENS, "temperature": 0, "n": 3,
            "use_beam_search": True, "logprobs": 1}
    if stream:
        events = stream_events(served, body, timeout=60)
        assert len(events) == 2 and events[1] == "[DONE]"
        response = json.loads(events[0])
    else:
        response = post(served, "/v1/completions", body, timeout=60).json()
    tok = served.llm.get_tokenizer()
    choices = response["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    for prompt, out in zip(PROMPTS[:2], served.beams):
        for beam in out.sequences:
            c = choices.pop(0)
            generated = beam.tokens[len(prompt):]
            assert c["text"] == tok.decode(generated) and c["finish_reason"] == "length"
            assert c["logprobs"]["tokens"] == [tok.decode([t]) for t in generated]
            assert sum(c["logprobs"]["token_logprobs"]) == pytest.approx(beam.cum_logprob, rel=1e-5)
    assert response["usage"]["completion_tokens"] == 6 * MAX_TOKENS
    chat = post(served, "/v1/chat/completions", {"model": MODEL, "messages": CHATS[0], "max_tokens": 4, "n": 2,
                                                 "temperature": 0, "use_beam_search": True}, timeout=60).json()
    assert [c["index"] for c in chat["choices"]] == [0, 1] and chat["choices"][0]["logprobs"] is None
    assert len({c["message"]["content"] for c in chat["choices"]}) == 2  # two different beams
    echoed = post(served, "/v1/chat/completions", {"model": MODEL, "messages": CONTINUED, "max_tokens": 4, "n": 2,
                                                   "temperature": 0, "use_beam_search": True, "echo": True,
                                                   "add_generation_prompt": False, "continue_final_message": True},
                  timeout=60)
    assert echoed.status_code == 200, echoed.text  # (refused before: a chat request's logprobs False read as asked)
    assert all(c["message"]["content"].startswith(CONTINUED[-1]["content"]) for c in echoed.json()["choices"])
    refused = post(served, "/v1/completions", {"model": MODEL, "prompt": "ab", "max_tokens": 2, "n": 2,
                                               "use_beam_search": True, "echo": True, "logprobs": 0})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "echo"
    wait_until_idle(served.url)


# ---- pieces

def test_logprobs_render_in_openai_formats(served):
    """vLLM's per-token {token_id: Logprob} (what SamplingParams.logprobs asks for) as OpenAI's completion and chat
    logprobs; a token without decoded text is decoded by the tokenizer."""
    from collections import namedtuple

    from jaxspec import CompletionOutput, RequestOutput
    from jaxspec.serve import protocol as api
    from jaxspec.serve.serving import ChatFormat, CompletionFormat, EngineInputs

    Logprob = namedtuple("Logprob", "logprob rank decoded_token")
    steps = [{5: Logprob(-0.1, 1, "f"), 7: Logprob(-2.5, 2, "h")}, {2: Logprob(-1.5, 2, None), 9: Logprob(-0.4, 1, "j")}]
    out = RequestOutput("r", None, [0, 1], outputs=[CompletionOutput(0, "fc", [5, 2], logprobs=steps,
                                                                     finish_reason="length")], finished=True)
    inputs, tok = EngineInputs([("r", {}, None)], [2]), served.llm.get_tokenizer()
    fmt = CompletionFormat("cmpl-1", MODEL, api.CompletionRequest(prompt="ab", logprobs=1), inputs, tok)
    fmt.add([out])
    assert fmt.response()["choices"][0]["logprobs"] == {  # OpenAI's (and vLLM's): the token itself and the top 1
        "tokens": ["f", "c"], "token_logprobs": [-0.1, -1.5], "top_logprobs": [{"f": -0.1, "h": -2.5},
                                                                                {"c": -1.5, "j": -0.4}],
        "text_offset": [0, 1]}
    streamed = CompletionFormat("cmpl-2", MODEL, api.CompletionRequest(prompt="ab", logprobs=1, stream=True), inputs,
                                tok)
    (chunk,) = streamed.chunks([out])  # the same logprobs, streamed (they were rendered as {} before)
    assert json.loads(chunk)["choices"][0]["logprobs"] == fmt.response()["choices"][0]["logprobs"]
    chat = ChatFormat("chatcmpl-1", MODEL, api.ChatCompletionRequest(
        messages=[{"role": "user", "content": "a"}], logprobs=True, top_logprobs=2), inputs, tok)
    role, content = (json.loads(e)["choices"][0] for e in chat.chunks([out]))
    assert role["delta"] == {"role": "assistant", "content": ""}
    tokens = content["logprobs"]["content"]
    assert [(t["token"], t["logprob"], t["bytes"]) for t in tokens] == [("f", -0.1, [102]), ("c", -1.5, [99])]
    assert [(t["token"], t["logprob"]) for t in tokens[1]["top_logprobs"]] == [("j", -0.4), ("c", -1.5)]


@pytest.mark.parametrize("stream_options", [None, {"include_usage": True},
                                            {"include_usage": True, "continuous_usage_stats": True}])
def test_stream_chunks_are_the_schemas_json(stream_options):
    """The chunks written as text are, byte for byte, what the pydantic chunk models render (vLLM's format): any
    text (quotes, escapes, control and non-ASCII characters), finish and stop reasons, usage fields."""
    from jaxspec import CompletionOutput, RequestOutput
    from jaxspec.serve import protocol as api
    from jaxspec.serve.serving import ChatFormat, CompletionFormat, EngineInputs

    texts = ["abc", "", 'q"uo\\te/', "ünï 数学 😀", "\n\t\x01\x1f\x7f\u2028"]
    ends = [(None, None), ("stop", None), ("stop", 7), ("stop", "жz"), ("length", None)]
    inputs = EngineInputs([("r", {}, None)], [3])
    messages = [{"role": "user", "content": "a"}]
    chat = ChatFormat("chatcmpl-1", MODEL, api.ChatCompletionRequest(messages=messages, n=2, stream=True,
                                                                     stream_options=stream_options), inputs, None)
    cmpl = CompletionFormat("cmpl-1", MODEL, api.CompletionRequest(prompt="ab", n=2, stream=True,
                                                                   stream_options=stream_options), inputs, None)

    def envelope(fmt, cls, choices):
        extra = {}
        if fmt.include_usage:
            extra["usage"] = fmt.usage() if fmt.continuous_usage else None
        return cls(id=fmt.request_id, object=fmt.chunk_object, created=fmt.created, model=MODEL, choices=choices,
                   **extra).model_dump_json(exclude_unset=True)

    for step, text in enumerate(texts):
        for index in (0, 1):
            reason, stop = ends[(step + index) % len(ends)]
            out = RequestOutput("r", None, [0, 1, 2], outputs=[CompletionOutput(index, text, [5], None, None, reason,
                                                                                stop)])
            first = index not in chat.choices
            got = chat.chunks([out])
            want = [envelope(chat, api.ChatCompletionChunk, [api.ChatStreamChoice(
                index=index, delta=api.DeltaMessage(role="assistant", content=""), logprobs=None, finish_reason=None)])
                    ] if first else []
            if text or reason:
                want.append(envelope(chat, api.ChatCompletionChunk, [api.ChatStreamChoice(
                    index=index, delta=api.DeltaMessage(content=text), logprobs=None, finish_reason=reason,
                    stop_reason=stop)]))
            assert got == want
            got = cmpl.chunks([out])
            want = [envelope(cmpl, api.CompletionResponse, [api.CompletionChoice(
                index=index, text=text, logprobs=None, finish_reason=reason, stop_reason=stop)])]
            assert got == (want if text or reason else [])
    for fmt, cls in ((chat, api.ChatCompletionChunk), (cmpl, api.CompletionResponse)):
        want = cls(id=fmt.request_id, object=fmt.chunk_object, created=fmt.created, model=MODEL, choices=[],
                   usage=fmt.usage()).model_dump_json(exclude_unset=True) if stream_options else None
        assert fmt.usage_chunk() == want


def test_serve_command_wires_vllm_flags(tmp_path, monkeypatch):
    """`jaxspec serve`: vLLM's flags reach the LLM, the server binds 127.0.0.1 unless told otherwise, and
    JAXSPEC_API_KEY is read as it starts."""
    from fastapi.testclient import TestClient

    from jaxspec.cli import main
    from jaxspec.convert.checkpoint import save_checkpoint
    from tests.tiny import TINY

    path = tmp_path / "model"  # a preset's layout: the tokenizer in hf/, the checkpoint in ckpt/
    make_model_dir(path / "hf")
    save_checkpoint(path / "ckpt", TINY, tiny_weights())
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(kw, app=app))
    monkeypatch.setenv("JAXSPEC_API_KEY", "from-env")
    flags = ["serve", str(path), "--served-model-name", "t", "--max-model-len", "64", "--max-num-seqs", "2",
             "--max-num-batched-tokens", "16", "--block-size", "8", "--decode-buckets", "2", "--prefill-buckets",
             "16", "--no-async-scheduling", "--override-generation-config", '{"temperature": 0, "max_new_tokens": 5}']
    main([*flags, "--disable-frontend-multiprocessing"])
    assert (started["host"], started["port"], started["loop"]) == ("127.0.0.1", 8000, "asyncio")
    llm = started["app"].state.engine.llm
    cfg = llm.engine_config
    assert (cfg.max_model_len, cfg.max_num_seqs, cfg.page_size, cfg.decode_buckets) == (64, 2, 8, [2])
    assert llm.llm_engine.async_scheduling is False
    with TestClient(started["app"]) as client:  # runs the lifespan: the engine thread starts and stops
        assert client.get("/v1/models").status_code == 401
        auth = {"Authorization": "Bearer from-env"}
        assert client.get("/v1/models", headers=auth).json()["data"][0]["id"] == "t"
        r = client.post("/v1/completions", headers=auth,
                        json={"prompt": "ab", "max_tokens": 3, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # no temperature and no max_tokens: the generation config's (greedy, 5 tokens), as llm.generate's default
        r = client.post("/v1/completions", headers=auth, json={"prompt": "ab", "max_tokens": None, "ignore_eos": True})
    default = llm.get_default_sampling_params()  # (the engine thread has stopped: the LLM is the test's again)
    assert (default.temperature, default.max_tokens) == (0, 5)
    expected = llm.generate("ab", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert r.json()["choices"][0]["text"] == expected[0].outputs[0].text
    assert r.json()["usage"]["completion_tokens"] == 5
    # the default: the same LLM built from the same flags in an engine process, the same answers
    main(flags)
    engine = started["app"].state.engine
    assert isinstance(engine, EngineProcess) and engine.pid != os.getpid() and engine.max_model_len == 64
    with TestClient(started["app"]) as client:
        r = client.post("/v1/completions", headers=auth, json={"prompt": "ab", "max_tokens": None, "ignore_eos": True})
    assert r.json()["choices"][0]["text"] == expected[0].outputs[0].text
    assert not engine._process.is_alive()  # stopped with the app


def test_serve_chat_and_http_flags(tmp_path, monkeypatch):
    """vLLM's --chat-template (a file, or the template itself), --trust-request-chat-template, --response-role,
    CORS (--allowed-origins, none by default; its preflights answered before the API key's check), --root-path,
    and the request-logging flags."""
    from fastapi.testclient import TestClient

    from jaxspec.cli import main
    from jaxspec.convert.checkpoint import save_checkpoint
    from jaxspec.serve.cli import load_chat_template

    path = tmp_path / "model"
    make_model_dir(path / "hf")
    save_checkpoint(path / "ckpt", TINY, tiny_weights())
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}Q"
                        "{% endif %}")
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(kw, app=app))
    flags = ["serve", str(path), "--max-model-len", "64", "--max-num-seqs", "2", "--max-num-batched-tokens", "16",
             "--block-size", "8", "--decode-buckets", "2", "--prefill-buckets", "16",
             "--disable-frontend-multiprocessing"]
    main([*flags, "--chat-template", str(template), "--response-role", "bot", "--trust-request-chat-template",
          "--allowed-origins", '["http://a.example"]', "--root-path", "/api", "--enable-log-requests",
          "--disable-log-requests", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--api-key", "k"])
    assert started["root_path"] == "/api"
    tok = started["app"].state.engine.tokenizer
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    no_key = {"Authorization": ""}
    with TestClient(started["app"], headers={"Authorization": "Bearer k"}) as client:
        assert client.post("/tokenize", json=body, headers=no_key).status_code == 401
        assert client.post("/tokenize", json=body).json()["tokens"] == tok.encode("hiQ")  # the file's template
        own = {**body, "chat_template": "{{ messages[0]['content'] }}X"}  # trusted: the request's own
        assert client.post("/tokenize", json=own).json()["tokens"] == tok.encode("hiX")
        r = client.post("/v1/chat/completions", json=body).json()
        assert r["choices"][0]["message"]["role"] == "bot" and r["usage"]["prompt_tokens"] == 3
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        r = client.post("/v1/chat/completions", json={**body, "tools": tools})  # auto: the answer parsed for calls
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
        preflight = {"Origin": "http://a.example", "Access-Control-Request-Method": "POST"}
        r = client.options("/v1/chat/completions", headers=preflight | no_key)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://a.example"
    main([*flags, "--chat-template", "{{ messages[0]['content'] }}Y"])  # the template itself
    with TestClient(started["app"]) as client:
        assert client.post("/tokenize", json=body).json()["tokens"] == tok.encode("hiY")
        assert client.post("/tokenize", json=own).json()["error"]["param"] == "chat_template"  # not trusted now
        assert "access-control-allow-origin" not in client.options(
            "/v1/chat/completions", headers={"Origin": "http://a.example", "Access-Control-Request-Method": "POST"}
        ).headers  # no CORS unless asked
    with pytest.raises(SystemExit):
        main([*flags, "--chat-template", str(tmp_path / "missing.jinja")])
    with pytest.raises(SystemExit, match="needs --tool-call-parser"):
        main([*flags, "--enable-auto-tool-choice"])
    assert load_chat_template("{{ a }}\\n{{ b }}") == "{{ a }}\n{{ b }}"  # vLLM decodes a template's escapes


def test_the_servers_process_never_imports_jax(tmp_path):
    """`jaxspec serve` (the engine in its own process): the server's process answers a request without ever
    importing JAX, so it holds no device and no device memory."""
    from jaxspec.convert.checkpoint import save_checkpoint
    from tests.tiny import TINY

    path = tmp_path / "model"
    make_model_dir(path / "hf")
    save_checkpoint(path / "ckpt", TINY, tiny_weights())
    code = ("import sys, uvicorn\n"
            "from fastapi.testclient import TestClient\n"
            "from jaxspec.cli import main\n"
            "def run(app, **kw):\n"
            "    with TestClient(app) as client:\n"
            "        r = client.post('/v1/completions', json={'prompt': 'ab', 'max_tokens': 3, 'ignore_eos': True})\n"
            "    print(r.status_code, r.json()['usage']['completion_tokens'], 'jax' in sys.modules)\n"
            "uvicorn.run = run\n"
            f"main(['serve', {str(path)!r}, '--max-model-len', '64', '--max-num-seqs', '2', "
            "'--max-num-batched-tokens', '16', '--block-size', '8', '--decode-buckets', '2', "
            "'--prefill-buckets', '16'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=600,
                         cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["200", "3", "False"], out.stdout


def test_other_commands_do_not_import_the_server():
    """Every command's parser is built without FastAPI, uvicorn or prometheus_client (the serve extra)."""
    code = ("import argparse, sys, jaxspec.cli as cli\n"
            "sub = argparse.ArgumentParser().add_subparsers()\n"
            "[add(sub) for add in cli.COMMANDS.values()]\n"
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'prometheus_client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "[]"
