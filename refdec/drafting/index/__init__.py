"""Token indexes: a frozen corpus index on disk (corpus.py; several as one: shards.py) and the live
context index (context.py), with the four queries they share (queries.py) and the documents and
tokenizer fingerprint they are built from (documents.py).

Both are suffix automata over int32 token ids (C++ core ``refdec._C``):

* :class:`CorpusIndex` -- built once from many documents, saved to one file
  and memory-mapped on load (no copy; milliseconds even for 100M tokens).
  A match or a continuation never crosses a document boundary.
* :class:`ContextIndex` -- the growing context of one request (prompt plus
  accepted tokens), one open document extended in O(1) amortised per token.

Queries (on both):

* ``match_length(tokens) -> int``: length of the longest suffix of ``tokens``
  that occurs in the index.
* ``count(tokens) -> int``: occurrences of ``tokens`` as a contiguous run inside
  one document; ``count([])`` is the number of token positions, ``len(index)``.
* ``next_tokens(tokens, k) -> list[(token, count)]``: up to ``k`` tokens that
  follow occurrences of ``tokens``, most frequent first, ties by smaller id.
* ``continuation(tokens, length) -> int32 array``: the tokens that follow one
  occurrence of ``tokens`` (the most frequent branch at each step), at most
  ``length``, never crossing a document end; empty when ``tokens`` does not
  occur or only ends documents.

Token ids must be in ``[0, 2**31)``, else ``ValueError`` naming the value; ids
at or above the index's ``vocab_size`` are simply not found.

An empty corpus (no documents, or only empty ones) is a valid index that
answers "no match" everywhere (``match_length`` 0, ``count`` 0, no next
tokens, empty continuations); it saves and loads. ``refdec index build``
refuses to write one (an error naming why no document was read).

Thread-safety:

* :class:`CorpusIndex` and :class:`ShardedIndex` -- thread-safe for queries.
  ``build`` and ``add_documents`` freeze the index before returning; queries
  then read the frozen arrays only (no cache, nothing mutable), so any number
  of threads may query one index and share it between Proposers. The C++
  calls (queries, build, freeze, verify, load) release the GIL.
  ``add_documents`` must not run concurrently with anything else on the
  same index.
* :class:`ContextIndex` -- NOT thread-safe: it grows, and its occurrence
  counts are recomputed lazily inside queries. One per request.
* :class:`refdec.Proposer` -- NOT thread-safe (it owns a ContextIndex and
  matcher state): one per request; the CorpusIndex it reads may be shared.

Limits: fewer than 2**31 - 1 tokens per index, and internal states + tokens
< 2**31 (about 1.4 billion tokens of text); beyond that, shard
(:class:`ShardedIndex`, docs/SHARDING.md).
"""

from refdec.drafting.index.context import ContextIndex
from refdec.drafting.index.corpus import CorpusIndex, IndexFormatError
from refdec.drafting.index.documents import tokenizer_fingerprint
from refdec.drafting.index.shards import ShardedIndex

__all__ = ["IndexFormatError", "tokenizer_fingerprint", "CorpusIndex", "ContextIndex", "ShardedIndex"]
