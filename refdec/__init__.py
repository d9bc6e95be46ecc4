"""refdec: retrieval-based, lossless speculative decoding."""

from refdec.index import ContextIndex, CorpusIndex, IndexFormatError, ShardedIndex
from refdec.proposer import Proposer
from refdec.tree import DraftTree
from refdec.decoding import DecodingStats, GenerateOutput, SpeculativeDecoder, generate

__all__ = [
    "CorpusIndex", "ContextIndex", "IndexFormatError", "ShardedIndex", "DraftTree", "Proposer",
    "generate", "SpeculativeDecoder", "DecodingStats", "GenerateOutput",
]
