"""refdec: retrieval-based, lossless speculative decoding.

The public names are loaded on first use (PEP 562), so that ``import refdec.cli`` and
``refdec --help`` do not import torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "ContextIndex": "refdec.drafting.index", "CorpusIndex": "refdec.drafting.index", "IndexFormatError": "refdec.drafting.index",
    "ShardedIndex": "refdec.drafting.index", "DraftBatch": "refdec.drafting.tree", "DraftTree": "refdec.drafting.tree", "Drafter": "refdec.drafting.proposer",
    "Proposer": "refdec.drafting.proposer", "SpeculativeDecoder": "refdec.engine.decoder", "generate": "refdec.engine.decoder",
    "DecodingStats": "refdec.engine.results", "GenerateOutput": "refdec.engine.results",
    "OutputMemory": "refdec.drafting.memory", "DecodeSettings": "refdec.engine.settings",
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from refdec.drafting.index import ContextIndex, CorpusIndex, IndexFormatError, ShardedIndex
    from refdec.drafting.memory import OutputMemory
    from refdec.drafting.proposer import Drafter, Proposer
    from refdec.drafting.tree import DraftBatch, DraftTree
    from refdec.engine.decoder import SpeculativeDecoder, generate
    from refdec.engine.results import DecodingStats, GenerateOutput
    from refdec.engine.settings import DecodeSettings


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'refdec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
