"""Specifies refdec.drafting.index.shards: several corpus index files queried as one corpus, with
the answers of one index over all their documents."""

from __future__ import annotations

import numpy as np
import pytest

from refdec import CorpusIndex, ShardedIndex


def test_a_sharded_index_answers_like_one_index_over_all_documents(tmp_path):
    rng = np.random.default_rng(9)
    docs = [rng.integers(0, 4, size=int(n)).astype(np.int32) for n in rng.integers(0, 80, size=12)]
    whole = CorpusIndex.build(docs, show_progress=False)
    paths = []
    for i, part in enumerate((docs[:3], docs[3:4], docs[4:])):
        paths.append(tmp_path / f"shard{i}.refdec")
        CorpusIndex.build(part, show_progress=False).save(paths[-1])
    sharded = ShardedIndex.load_many(paths)
    assert (len(sharded), sharded.num_documents) == (len(whole), whole.num_documents) and sharded.verify()
    assert all(sharded.document(i).tolist() == docs[i].tolist() for i in range(len(docs)))
    queries = [rng.integers(0, 5, size=int(rng.integers(0, 7))).tolist() for _ in range(300)]
    for q in queries:
        assert sharded.match_length(q) == whole.match_length(q), q
        assert sharded.count(q) == whole.count(q), q
        assert sharded.next_tokens(q, 3) == whole.next_tokens(q, 3), q
        assert sharded.continuation(q, 20).tolist() == whole.continuation(q, 20).tolist(), q


def test_shards_with_different_vocab_sizes_are_refused():
    a = CorpusIndex.build([[1]], vocab_size=10, show_progress=False)
    b = CorpusIndex.build([[1]], vocab_size=20, show_progress=False)
    with pytest.raises(ValueError, match="vocab_size 20 differs"):
        ShardedIndex([a, b])
