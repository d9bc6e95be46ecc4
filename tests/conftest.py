"""Shared fixtures: tiny random float64 models (see tiny_models.py), one thread."""

from __future__ import annotations

import pytest
import torch

from tiny_models import MODEL_BUILDERS, cached_model

torch.set_num_threads(1)

FAMILIES = sorted(MODEL_BUILDERS)


@pytest.fixture(scope="session")
def tiny_model_cache():
    return {}


@pytest.fixture(params=FAMILIES)
def family_model(request, tiny_model_cache):
    """(family name, model) for every tiny model family, built once per session."""
    return request.param, cached_model(tiny_model_cache, request.param)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A character-level tokenizer over the tiny vocabulary (for stop strings and text references)."""
    from tiny_models import char_tokenizer

    return char_tokenizer()
