"""refdec: retrieval-based, lossless speculative decoding."""

from refdec.index import ContextIndex, CorpusIndex, IndexFormatError
from refdec.proposer import Proposer
from refdec.tree import DraftTree

__all__ = ["CorpusIndex", "ContextIndex", "IndexFormatError", "DraftTree", "Proposer"]
