"""`jaxspec serve`: an OpenAI-compatible HTTP server over `LLM.llm_engine` (vLLM's `vllm serve`).

    protocol.py     request and response bodies (pydantic), OpenAI's and vLLM's field names
    engine_loop.py  the engine on its own thread; the asyncio side submits, aborts and reads outputs
    serving.py      requests -> engine inputs (tokenized here), outputs -> responses and stream chunks
    metrics.py      Prometheus metrics under vLLM's names
    app.py          the FastAPI routes, errors, API key (`build_app(llm, ...)`)
    cli.py          the command's flags and uvicorn
"""
