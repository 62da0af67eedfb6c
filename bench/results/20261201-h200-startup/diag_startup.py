"""Where a warm `jaxspec generate` spends its wall time: its phases, timed from the process start (T_START)."""
import os, sys, time
T0 = float(os.environ["T_START"])
def mark(what): print(f"{time.time() - T0:7.2f} s  {what}", flush=True)
mark("python up")
import argparse
import jax
mark("import jax")
jax.devices()
mark("jax.devices() (backend init)")
import jaxspec, jaxspec.bench.engine as be, jaxspec.generate as g
from jaxspec import llm as llm_module
mark("import jaxspec, generate")
def timed(f, name):
    def wrapper(*a, **k):
        t = time.time(); r = f(*a, **k); mark(f"{name}: {time.time() - t:.2f} s"); return r
    return wrapper
g.chat_prompts = timed(g.chat_prompts, "tokenizer + chat prompts")
jaxspec.LLM = timed(jaxspec.LLM, "LLM(...)")
be.compile_buckets = timed(be.compile_buckets, "compile_buckets")
import jaxspec.loader as ld, jaxspec.tokenizer as tk
ld.load_target = timed(ld.load_target, "loader.load_target (checkpoint)")
ld.load_draft = timed(ld.load_draft, "loader.load_draft (head)")
llm_module.ModelRunner = timed(llm_module.ModelRunner, "ModelRunner(...) (KV pool, device state)")
llm_module.load_tokenizer = timed(llm_module.load_tokenizer, "LLM's load_tokenizer")
tk.load_tokenizer = timed(tk.load_tokenizer, "generate's load_tokenizer")
p = argparse.ArgumentParser(); g.add_arguments(p)
g.run(p.parse_args([]))
mark(f"generate done (torch imported: {'torch' in sys.modules})")
