"""refdec.engine.defaults: each default is stated once and every layer that offers it reads it there
(the Python API, the decoding service, both backends and the command line)."""

from __future__ import annotations

import inspect

import pytest

import refdec
from refdec.cli.main import build_parser
from refdec.engine import defaults
from refdec.engine.decoder import make_backend
from refdec.engine.service import DecodingService
from refdec.engine.settings import DecodeSettings
from refdec.transformers.backend import TransformersBackend


def default_of(function, name: str):
    return inspect.signature(function).parameters[name].default


def test_the_python_api_and_the_service_read_the_defaults():
    for function in (refdec.generate, refdec.SpeculativeDecoder.generate):
        assert default_of(function, "max_new_tokens") == defaults.MAX_NEW_TOKENS, function
    assert DecodeSettings().max_new_tokens == defaults.MAX_NEW_TOKENS  # what DecodingService.submit reads
    for function in (refdec.SpeculativeDecoder.__init__, make_backend, TransformersBackend.__init__):
        assert default_of(function, "prefix_cache") == defaults.PREFIX_CACHE_ENTRIES, function
    assert default_of(DecodingService.__init__, "max_concurrent") == defaults.MAX_CONCURRENT
    assert default_of(DecodingService.__init__, "max_waiting") == defaults.MAX_WAITING


def test_the_llama_cpp_backend_reads_the_defaults():
    pytest.importorskip("llama_cpp")
    from refdec.llama_cpp.backend import LlamaCppBackend

    assert default_of(LlamaCppBackend.__init__, "prefix_cache") == defaults.PREFIX_CACHE_ENTRIES


def test_the_command_line_reads_the_defaults_and_says_them():
    parser = build_parser()
    serve = parser.parse_args(["serve"])
    assert (serve.max_concurrent, serve.max_waiting, serve.prefix_cache) == (
        defaults.MAX_CONCURRENT, defaults.MAX_WAITING, defaults.PREFIX_CACHE_ENTRIES)
    assert parser.parse_args(["generate", "--prompt", "x"]).max_new_tokens == defaults.MAX_NEW_TOKENS
    commands = next(a for a in parser._actions if a.dest == "command").choices
    help_text = commands["serve"].format_help()
    assert f"(default: {defaults.MAX_WAITING})" in help_text and f"(default: {defaults.MAX_CONCURRENT})" in help_text
