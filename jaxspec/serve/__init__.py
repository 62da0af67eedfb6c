"""`jaxspec serve`: an OpenAI-compatible HTTP server over `LLM.llm_engine` (vLLM's `vllm serve`).

    protocol.py     request and response bodies (pydantic), OpenAI's and vLLM's field names
    engine_core.py  the engine's owner: commands in, events out (a step's outputs, metrics, acknowledgements)
    engine_loop.py  the asyncio side (submit, abort, read outputs), with the engine core on a thread
    engine_process.py  the engine core in a process of its own (the default), the server's end of its pipes
    wire.py         a step's outputs as tuples across the pipe; the text of most requests made in the server
    serving.py      requests -> engine inputs (tokenized here), outputs -> responses and stream chunks
    beam_serving.py use_beam_search: the beam search of jaxspec.beam_search, one engine call a step
    metrics.py      Prometheus metrics under vLLM's names
    app.py          the FastAPI routes, errors, API key (`build_app(engine, ...)`)
    cli.py          the command's flags and uvicorn
"""
