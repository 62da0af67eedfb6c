"""A server over random SmolLM2-shaped weights (token-id prompts), engine on a thread or in its own process."""
import argparse
import functools
import json

import uvicorn


def factory(spec: str, async_scheduling: bool, cache: str):
    from jaxspec import LLM
    from jaxspec.bench import data
    from jaxspec.models import llama

    _, hf = data.load_hf_config("smollm2-135m")
    cfg = llama.Config.from_hf(hf, "bfloat16")
    kw = {}
    if spec != "none":
        kw = dict(speculative_config={"method": "eagle", "model": "dummy", "num_speculative_tokens": 3},
                  synthetic_acceptance=0.6)
    return LLM.from_weights(cfg, None, load_format="dummy", max_model_len=1024, max_num_seqs=64,
                            max_num_batched_tokens=1024, decode_buckets=[1, 8, 32, 64], prefill_buckets=[256, 1024],
                            layer_loop="scan", async_scheduling=async_scheduling, compilation_cache_dir=cache,
                            warmup=True, **kw)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["process", "thread"])
    p.add_argument("--spec", default="k3")
    p.add_argument("--async-scheduling", type=int, default=1)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--cache", default="/root/jcache")
    a = p.parse_args()
    from jaxspec.serve.app import build_app
    from jaxspec.serve.engine_process import EngineProcess

    make = functools.partial(factory, a.spec, bool(a.async_scheduling), a.cache)
    engine = EngineProcess.launch(make) if a.mode == "process" else make()
    app = build_app(engine, served_model_name="dummy")
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning", access_log=False, loop="asyncio")


if __name__ == "__main__":
    main()
