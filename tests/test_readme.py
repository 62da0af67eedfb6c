"""The README runs as written: every ```python block is executed, every command line it shows (in shell blocks
and inline) is parsed by the real argparse parser, the cheap ones run for real, and every `--flag` it names is
an option of some command. Generic over README.md, so sections added later are checked too.

- Python blocks run in a subprocess from the checkout's root, on the CPU, with the compilation cache off and
  XLA's default optimization (the suite's quick-compile flags make a 135M model's steps seconds long). A block
  naming a preset needs it fetched: skipped, as in test_smollm2.py, when the download fails.
- Command lines: `jaxspec ...`, `python -m jaxspec ...` and `python bench/<script>.py ...`; `make <target>` is
  checked with `make -n`; other programs are not checked. `[...]` marks optional arguments: parsed too.
- RUN_FOR_REAL commands run in a temporary directory (relative outputs land there) with inputs named in
  PLACEHOLDERS replaced by tiny fixtures; the rest are only parsed, so a renamed or removed flag fails here.
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest

from jaxspec import presets

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
COMMAND = re.compile(r"^(jaxspec|python -m jaxspec|python bench/[\w.-]+\.py|make)(\s|$)")
RUN_FOR_REAL = {("jaxspec", "convert"), ("jaxspec", "fetch")}  # seconds each, with the fixtures below
# placeholder input in the README -> fixture (a key of `fixtures`) that stands in for it
PLACEHOLDERS = {"path/to/hf-llama-dir": "hf_dir", "model.gguf": "gguf"}
PYTHON_TIMEOUT_S = 300


def blocks(lang: str) -> list[str]:
    return [body for fence_lang, body in FENCE.findall(README) if fence_lang == lang]


def prose() -> str:
    return FENCE.sub("", README)


def shell_lines(text: str) -> list[str]:
    """Logical lines: continuations joined, comments dropped."""
    return [line.strip() for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def block_commands() -> list[str]:
    lines = [line for body in blocks("bash") + blocks("sh") + blocks("shell") for line in shell_lines(body)]
    return [line for line in lines if COMMAND.match(line)]


def inline_commands() -> list[str]:
    """Commands quoted in the text: often fragments with placeholders (DIR, FILE.jsonl) or just a command's name,
    so parsed only, and missing required arguments are no error."""
    return [span for span in re.findall(r"`([^`\n]+)`", prose()) if COMMAND.match(span)]


def argv_of(line: str) -> list[str]:
    words = [w.strip("[]") for w in shlex.split(line, comments=True)]
    return [w for w in words if w]


class Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


@contextmanager
def stop_at_parse(collect: bool = False):
    """parse_args parses (unless `collect`) and then raises Parsed with the parser: nothing after it runs."""
    real = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        if not collect:
            real(self, args, namespace)
        raise Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_args):
        yield


def invoke(argv: list[str]) -> None:
    """Call the command's own main with argv (a `python bench/x.py` script as __main__)."""
    if argv[0] == "python" and argv[1] == "-m":
        argv = argv[2:]
    if argv[0] == "jaxspec":
        from jaxspec.cli import main
        main(argv[1:])
    else:
        script = ROOT / argv[1]
        with mock.patch.object(sys, "argv", [str(script), *argv[2:]]):
            runpy.run_path(str(script), run_name="__main__")


def program(argv: list[str]) -> tuple[str, ...]:
    """The program a command line runs: the jaxspec CLI or one script."""
    return ("jaxspec",) if "jaxspec" in argv[:3] else tuple(argv[:2])


def parser_of(prog: tuple[str, ...]) -> argparse.ArgumentParser:
    with stop_at_parse(collect=True):
        try:
            invoke(list(prog))
        except Parsed as p:
            return p.parser
    raise AssertionError(f"{' '.join(prog)}: never called parse_args")


def options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its subcommands, recursively."""
    found = set()
    for action in parser._actions:
        found |= set(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= options(sub)
    return found


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    """Tiny inputs standing in for the README's placeholders: an HF Llama directory and a GGUF file."""
    from tests.test_convert import tiny_hf, write_gguf

    tmp = tmp_path_factory.mktemp("readme_inputs")
    model = tiny_hf()
    model.save_pretrained(tmp / "hf")
    write_gguf(model, tmp / "tiny.gguf")
    return {"hf_dir": tmp / "hf", "gguf": tmp / "tiny.gguf"}


def test_the_readme_has_what_this_test_checks():
    assert blocks("python") and block_commands() and inline_commands()
    assert all(key in README for key in PLACEHOLDERS), "a placeholder left the README: drop it from PLACEHOLDERS"


@pytest.mark.parametrize("line, in_block", [(c, True) for c in block_commands()] +
                         [(c, False) for c in inline_commands()],
                         ids=lambda v: " ".join(argv_of(v))[:60] if isinstance(v, str) else "block" if v else "text")
def test_command_line(line, in_block, fixtures, tmp_path, monkeypatch, capsys):
    argv = argv_of(line)
    if argv[0] == "make":
        run = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stderr
        return
    if in_block and tuple(argv[:2]) in RUN_FOR_REAL:
        argv = [str(fixtures[PLACEHOLDERS[w]]) if w in PLACEHOLDERS else w for w in argv]
        monkeypatch.chdir(tmp_path)
        try:
            invoke(argv)
        except presets.FetchError as e:
            pytest.skip(f"cannot download: {e}")
        return
    with stop_at_parse():
        try:
            invoke(argv)
        except Parsed:
            return
        except SystemExit:
            err = capsys.readouterr().err
            if in_block or "the following arguments are required" not in err:  # the text may name a command
                pytest.fail(f"{line}\n{err}")
            return
    pytest.fail(f"{line}: never called parse_args")


def test_every_flag_named_is_an_option():
    known = set()
    for prog in {program(argv_of(line)) for line in block_commands() + inline_commands() if line[:4] != "make"}:
        known |= options(parser_of(prog))
    named = {flag for code in re.findall(r"`([^`]+)`", prose()) + blocks("bash") + blocks("python")
             for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", code)}
    assert named - known == set(), f"the README names flags no command has: {sorted(named - known)}"


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block(index):
    code = blocks("python")[index]
    for placeholder in PLACEHOLDERS:
        assert placeholder not in code, f"python block {index} names {placeholder!r}: use a real example"
    for name in presets.list_presets():
        if name in code:
            try:
                presets.fetch_preset(name)
            except presets.FetchError as e:
                pytest.skip(f"cannot download {name}: {e}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "",
           "JAX_COMPILATION_CACHE_DIR": ""}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=PYTHON_TIMEOUT_S)
    assert run.returncode == 0, f"python block {index} failed:\n{code}\n{run.stderr[-4000:]}"
