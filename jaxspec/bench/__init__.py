"""Benchmarks: `jaxspec bench throughput` (also `python bench/throughput.py`), modelled on `vllm bench throughput`.

    data.py         built-in model configs (`--hf-config llama-3-8b`), prompt sets (random tokens, JSONL chat)
    throughput.py   options, building the LLMs, timed runs, the async x sync x EAGLE x prompt-count sweep
    hf_baseline.py  transformers `generate` on the same prompts, in a subprocess (its own GPU memory and crashes)
    profile.py      device timelines (`jax.profiler.trace`) -> fraction of wall time the device is busy
    report.py       tables, JSON, plot, copy bandwidth, matmul rate, roofline, bench/RESULTS.md
    timing.py       the median time of one jitted call (the kernel micro-benchmarks in bench/)
"""
