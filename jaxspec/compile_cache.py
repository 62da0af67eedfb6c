"""JAX's persistent compilation cache, on by default in a per-user directory, so that a second process building
the same LLM loads its step programs from disk instead of compiling them again (on a GPU, tens of seconds each).

`compilation_cache_dir` (LLM parameter, `--compilation-cache-dir` on the commands that build one):
    None or "auto"   what jax is already configured with (JAX_COMPILATION_CACHE_DIR, jax.config, an earlier LLM),
                     else <user cache>/xla: $XDG_CACHE_HOME/jaxspec/xla, by default ~/.cache/jaxspec/xla
    "" or False      off (so is JAX_COMPILATION_CACHE_DIR="" under "auto")
    a path           that directory
jax trusts what it loads from the cache (a compiled program runs as it is), so the default directory is created
readable by its user only; do not point it at a directory others can write to.
"""

from __future__ import annotations

import logging
from pathlib import Path

from jaxspec import paths

logger = logging.getLogger("jaxspec")
# Every program is written, however quick its compile: the tiny CPU step programs compile in well under jax's
# default threshold of 1 s, and the cache holds only what the engine compiles (a few dozen programs per model).
MIN_COMPILE_TIME_S = 0.0


def add_argument(parser) -> None:
    """`--compilation-cache-dir`, as every command that builds an LLM spells it."""
    parser.add_argument("--compilation-cache-dir", default=None, metavar="DIR",
                        help=f"jax persistent compilation cache, reused by later runs (default {default_dir()}, "
                             "or JAX_COMPILATION_CACHE_DIR; \"\" turns it off)")


def default_dir() -> Path:
    return paths.user_cache_dir() / "xla"


def configure(cache_dir: str | Path | bool | None = None) -> Path | None:
    """Point jax's persistent cache where `cache_dir` says (see the module docstring); returns the directory in
    use, None when off. Call before the programs to be cached compile: jax decides once per process whether the
    cache is used, so a change resets that decision."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    current = jax.config.jax_compilation_cache_dir
    if cache_dir is None or cache_dir == "auto":
        if current is not None:  # configured by the user (a path, or "" for off) or by an earlier call
            return Path(current) if current else None
        wanted = default_dir()
        wanted.mkdir(parents=True, exist_ok=True, mode=0o700)
    elif cache_dir is False or cache_dir == "":
        wanted = None
    else:
        wanted = Path(cache_dir).expanduser()
    value = str(wanted) if wanted is not None else None
    if value != current:
        jax.config.update("jax_compilation_cache_dir", value)
        compilation_cache.reset_cache()
        logger.info("jax persistent compilation cache: %s", value or "off")
    if wanted is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    return wanted
