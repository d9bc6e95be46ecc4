"""Shared fixtures (tiny random float64 models, see tiny_models.py; one thread) and the test tiers.

Tiers (pyproject.toml markers):

* fast: everything unmarked, ``python -m pytest -m "not slow"`` (the README's command: under two
  minutes on 2 cores);
* ``full``: the heavy equivalence matrix (every model family x draft shape, chi-square runs,
  long loops, the cases of a second or more);
* ``llama``: refdec on llama.cpp (needs llama-cpp-python; CI's llama step);
* ``slow``: the real default model (``python -m pytest -m slow``).

``full`` and ``llama`` are deselected unless the ``-m`` expression names them (``python -m pytest -m
full``, ``-m llama``, ``-m "llama and full"``) or a test is named by node id (``tests/x.py::test_y``).
"""

from __future__ import annotations

import re

import pytest
import torch

from tiny_models import MASK_FAMILIES, cached_model, char_tokenizer, family_params, tiny_llama

torch.set_num_threads(1)


OPT_IN_TIERS = ("full", "llama")


def pytest_collection_modifyitems(config, items):
    """Deselects the ``full`` and ``llama`` tiers, each unless ``-m`` names it, unless node ids were given."""
    if any("::" in arg for arg in config.args):
        return
    markexpr = config.getoption("markexpr") or ""
    left_out = [tier for tier in OPT_IN_TIERS if not re.search(rf"\b{tier}\b", markexpr)]
    keep, deselected = [], []
    for item in items:
        (deselected if any(item.get_closest_marker(tier) for tier in left_out) else keep).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = keep


@pytest.fixture(scope="session")
def tiny_model_cache():
    return {}


@pytest.fixture(params=family_params())
def family_model(request, tiny_model_cache):
    """(family name, model) for every tiny model family, built once per session (Llama in the
    fast tier, the others in the full tier)."""
    return request.param, cached_model(tiny_model_cache, request.param)


@pytest.fixture(params=family_params(fast=MASK_FAMILIES))
def mask_family_model(request, tiny_model_cache):
    """family_model for the tests of masks and caches: Gemma 3 (sliding window 8, a dict of
    masks) in the fast tier too."""
    return request.param, cached_model(tiny_model_cache, request.param)


@pytest.fixture(params=family_params(("gemma3", "gpt2", "llama")))
def batch_family_model(request, tiny_model_cache):
    """(family name, model) for the batch tests, whose masks differ: Gemma 3 (a dict of masks,
    sliding window 8; full tier, a batch across its window in the fast tier:
    tests/test_transformers_prefill.py), GPT-2 (absolute position embeddings; full tier) and Llama
    (rotary, one mask)."""
    return request.param, cached_model(tiny_model_cache, request.param)


@pytest.fixture
def llama(tiny_model_cache):
    """The tiny Llama (seed 0), built once per session. A test that changes its generation_config
    restores it; one that needs other settings builds its own (tiny_models.tiny_llama())."""
    return cached_model(tiny_model_cache, "llama")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A character-level tokenizer over the tiny vocabulary (for stop strings and text references)."""
    return char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """``tiny_model_dir(seed)``: a folder holding the tiny Llama of that seed and the character
    tokenizer, saved like a real model directory (for the CLI's --model); saved once per session."""
    saved = {}

    def directory(seed: int = 0):
        if seed not in saved:
            saved[seed] = tmp_path_factory.mktemp(f"tiny-llama-{seed}")
            tiny_llama(seed=seed).save_pretrained(saved[seed])
            char_tokenizer().save_pretrained(saved[seed])
        return saved[seed]

    return directory


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """A tiny random llama model written as a GGUF file (benchmarks/random_gguf.py), once per session."""
    pytest.importorskip("gguf")
    from benchmarks.random_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _tiny_hybrid_llm(tmp_path_factory, writer: str, name: str):
    """A ``llama_cpp.Llama`` (one thread, 512 tokens of context) on the GGUF that
    ``benchmarks.random_gguf.<writer>`` writes; skips without llama-cpp-python or gguf."""
    llama_cpp = pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from benchmarks import random_gguf

    path = getattr(random_gguf, writer)(tmp_path_factory.mktemp("gguf") / name)
    return llama_cpp.Llama(str(path), n_ctx=512, n_threads=1, n_batch=64, verbose=False)


@pytest.fixture(scope="session")
def tiny_qwen35_llm(tmp_path_factory):
    """A tiny random Qwen3.5 model (llama.cpp's ``qwen35``: Gated DeltaNet layers beside gated
    attention), once per session."""
    return _tiny_hybrid_llm(tmp_path_factory, "write_tiny_qwen35_gguf", "tiny-qwen35.gguf")


@pytest.fixture(scope="session")
def tiny_mamba2_llm(tmp_path_factory):
    """A tiny random Mamba2 model (recurrent throughout, an architecture whose state llama.cpp cannot
    roll back), once per session."""
    return _tiny_hybrid_llm(tmp_path_factory, "write_tiny_mamba2_gguf", "tiny-mamba2.gguf")


@pytest.fixture(scope="session")
def tiny_lfm2_llm(tmp_path_factory):
    """A tiny random LFM2 model (llama.cpp's ``lfm2``: short convolutions beside attention), once per
    session."""
    return _tiny_hybrid_llm(tmp_path_factory, "write_tiny_lfm2_gguf", "tiny-lfm2.gguf")


@pytest.fixture(scope="module")
def fresh_refdec_cache(tmp_path_factory):
    """``$REFDEC_CACHE`` in a folder of the module's own while it runs: what the module's decoders
    calibrate ("auto" on the tiny GGUF) stays out of the user's ~/.cache/refdec."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REFDEC_CACHE", str(tmp_path_factory.mktemp("refdec-cache")))
        yield


@pytest.fixture(scope="session")
def tiny_llm(tiny_gguf):
    """A ``llama_cpp.Llama`` on the tiny GGUF model (one thread, 512 tokens of context), once per
    session; skips without llama-cpp-python. The tests of refdec.llama_cpp share it."""
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(str(tiny_gguf), n_ctx=512, n_threads=1, n_batch=64, verbose=False)
