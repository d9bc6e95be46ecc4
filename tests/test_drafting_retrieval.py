"""Specification of refdec.drafting.retrieval: shingles, MinHash signatures, de-duplication, top-k retrieval."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from datasketch import MinHash
from hypothesis import given, settings
from hypothesis import strategies as st

from refdec.drafting import retrieval
from refdec.drafting.retrieval import DocumentSignatures, Retriever, deduplicate, shingles

# ---------------------------------------------------------------------------
# Corpus helpers
# ---------------------------------------------------------------------------


def shared_vocab_corpus(num_docs: int, seed: int = 0) -> list[np.ndarray]:
    """Documents over one small vocabulary (64 ids) that also share stock phrases,
    like source files sharing idioms: plenty of shingles in common between documents."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, 64, rng.integers(4, 12)).astype(np.int32) for _ in range(40)]
    docs = []
    for _ in range(num_docs):
        parts, length, target = [], 0, int(rng.integers(150, 600))
        while length < target:
            part = phrases[rng.integers(len(phrases))] if rng.random() < 0.3 else rng.integers(0, 64, 6).astype(np.int32)
            parts.append(part)
            length += part.size
        docs.append(np.concatenate(parts).astype(np.int32))
    return docs


def scattered_edit(doc: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Replace round(fraction * len) tokens at random positions by ids outside the corpus vocabulary."""
    out = doc.copy()
    pos = rng.choice(doc.size, size=int(round(fraction * doc.size)), replace=False)
    out[pos] = rng.integers(10_000, 20_000, pos.size)
    return out


def line_edit(doc: np.ndarray, fraction: float, rng: np.random.Generator, run: int = 10) -> np.ndarray:
    """Replace round(fraction * len) tokens in contiguous runs of ``run`` tokens (edited lines)."""
    out = doc.copy()
    changed = max(1, int(round(fraction * doc.size)))
    lengths = [run] * (changed // run) + ([changed % run] if changed % run else [])
    for slot, length in zip(rng.choice(doc.size // run, size=len(lengths), replace=False), lengths):
        out[slot * run : slot * run + length] = rng.integers(10_000, 20_000, length)
    return out


def exact_jaccard(x: np.ndarray, y: np.ndarray, n: int = retrieval.DEFAULT_NGRAM) -> float:
    a = {tuple(x[i : i + n]) for i in range(len(x) - n + 1)}
    b = {tuple(y[i : i + n]) for i in range(len(y) - n + 1)}
    return len(a & b) / len(a | b)


@pytest.fixture(scope="module")
def corpus() -> list[np.ndarray]:
    return shared_vocab_corpus(300)


@pytest.fixture(scope="module")
def retriever(corpus) -> Retriever:
    return Retriever.from_documents(corpus)


# ---------------------------------------------------------------------------
# Shingles and signatures
# ---------------------------------------------------------------------------


def test_shingles_are_sorted_unique_hashes_of_the_ngram_set():
    doc = np.array([1, 2, 3, 1, 2, 3, 1, 2, 3], dtype=np.int32)  # trigram set {123, 231, 312}
    hs = shingles(doc, n=3)
    assert hs.dtype == np.uint64 and hs.size == 3 and np.all(np.diff(hs.astype(np.float64)) > 0)
    assert np.array_equal(hs, shingles(np.array([2, 3, 1, 2, 3, 1], dtype=np.int32), n=3))


def test_shingles_depend_on_token_order():
    assert not np.array_equal(shingles([1, 2, 3]), shingles([3, 2, 1]))


def test_document_shorter_than_n_is_one_shingle_distinct_from_longer_ngrams():
    assert shingles([7, 8], n=3).size == 1
    assert shingles([7], n=3).size == 1
    assert not np.intersect1d(shingles([7, 8], n=3), shingles([7, 8, 9], n=3)).size
    assert shingles(np.zeros(0, dtype=np.int32)).size == 0


def test_exact_jaccard_of_shingle_hashes_equals_jaccard_of_ngram_tuples(corpus):
    for i, j in [(0, 1), (2, 3), (4, 4)]:
        got = retrieval._jaccard(shingles(corpus[i]), shingles(corpus[j]))
        assert got == pytest.approx(exact_jaccard(corpus[i], corpus[j]), abs=1e-12)


def test_signatures_are_datasketch_minhashes_of_the_shingles_also_for_a_document_hashed_in_parts(corpus):
    long_doc = np.random.default_rng(1).integers(0, 50_000, 40_000).astype(np.int32)  # > one update of rows
    docs = [corpus[0], corpus[1], long_doc, np.array([5], dtype=np.int32)]
    sigs = DocumentSignatures.from_documents(docs)
    assert sigs.matrix.dtype == np.uint32 and sigs.matrix.shape == (4, 128)
    for doc_idx, doc in enumerate(docs):
        m = MinHash(num_perm=128, seed=1, scheme="affine32", hashfunc=lambda x: x)
        m.update_batch([int(h) & 0xFFFFFFFF for h in shingles(doc)])  # at once
        assert np.array_equal(sigs.matrix[doc_idx], m.hashvalues), doc_idx


def test_signature_of_the_empty_document_is_datasketch_empty_value():
    sigs = DocumentSignatures.from_documents([np.zeros(0, dtype=np.int32)])
    assert np.all(sigs.matrix == MinHash(num_perm=128, scheme="affine32").hashvalues)


def test_signatures_are_identical_in_a_fresh_process(corpus):
    # Load the module by path: importing the refdec package would pull in torch.
    code = (
        "import importlib.util, sys, numpy as np;"
        f"spec = importlib.util.spec_from_file_location('r', {retrieval.__file__!r});"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
        "d = np.arange(1000, dtype=np.int32) % 97;"
        "sys.stdout.write(m.DocumentSignatures.from_documents([d]).matrix.tobytes().hex())"
    )
    env = dict(os.environ, PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    here = DocumentSignatures.from_documents([np.arange(1000, dtype=np.int32) % 97]).matrix
    assert bytes.fromhex(out) == here.tobytes()


def test_concatenated_signatures_are_the_rows_of_the_parts_in_order(corpus):
    whole = DocumentSignatures.from_documents(corpus[:5])
    parts = [DocumentSignatures.from_documents(corpus[:2]), DocumentSignatures.from_documents(corpus[2:5])]
    assert DocumentSignatures.concatenate(parts) == whole
    with pytest.raises(ValueError, match=r"parts\[1\] has \(num_perm, seed, ngram\) = \(128, 1, 4\)"):
        DocumentSignatures.concatenate([parts[0], DocumentSignatures.from_documents(corpus[2:5], ngram=4)])


def test_signature_matrix_is_read_only(corpus):
    sigs = DocumentSignatures.from_documents(corpus[:3])
    with pytest.raises(ValueError):
        sigs.matrix[0, 0] = 0


# ---------------------------------------------------------------------------
# De-duplication
# ---------------------------------------------------------------------------


def test_near_duplicates_with_1pct_scattered_edits_are_dropped_and_distinct_docs_kept(corpus):
    rng = np.random.default_rng(2)
    originals = corpus[:40]
    edited = [scattered_edit(d, 0.01, rng) for d in originals[:20]]
    kept, dropped = deduplicate(originals + edited, threshold=0.9)
    assert kept.dtype == np.int64
    assert kept.tolist() == list(range(40)) and dropped == 20


def test_near_duplicates_with_2pct_of_tokens_changed_in_edited_lines_are_dropped(corpus):
    rng = np.random.default_rng(3)
    originals = corpus[40:80]
    edited = [line_edit(d, 0.02, rng) for d in originals]
    for a, b in zip(originals, edited):
        assert exact_jaccard(a, b) >= 0.9
    kept, dropped = deduplicate(originals + edited, threshold=0.9)
    assert kept.tolist() == list(range(40)) and dropped == 40


def test_a_document_is_dropped_exactly_when_its_shingle_jaccard_reaches_the_threshold(corpus):
    # n = 3: scattered edits of 2-4 % straddle 0.9 (J ~ (1 - 3f) / (1 + 3f)); 2 % scattered is ~0.89: kept.
    rng = np.random.default_rng(4)
    for doc_idx in range(80, 120):
        original = corpus[doc_idx]
        edited = scattered_edit(original, rng.uniform(0.005, 0.04), rng)
        kept, dropped = deduplicate([original, edited], threshold=0.9)
        is_dup = exact_jaccard(original, edited) >= 0.9
        assert dropped == int(is_dup) and kept.tolist() == ([0] if is_dup else [0, 1]), doc_idx


def test_first_occurrence_is_kept_whichever_copy_comes_first(corpus):
    rng = np.random.default_rng(5)
    edited = scattered_edit(corpus[0], 0.01, rng)
    kept, dropped = deduplicate([corpus[1], edited, corpus[2], corpus[0]], threshold=0.9)
    assert kept.tolist() == [0, 1, 2] and dropped == 1


def test_exact_duplicates_are_dropped_at_any_threshold(corpus):
    docs = [corpus[0], corpus[1], corpus[0].copy(), corpus[1].astype(np.int64), corpus[0]]
    for threshold in (0.05, 0.9, 1.0):
        kept, dropped = deduplicate(docs, threshold=threshold)
        assert kept.tolist() == [0, 1] and dropped == 3


def test_empty_documents_first_kept_and_repeats_dropped(corpus):
    empty = np.zeros(0, dtype=np.int32)
    kept, dropped = deduplicate([empty, corpus[0], empty, [5]], threshold=0.9)
    assert kept.tolist() == [0, 1, 3] and dropped == 1


def test_deduplicate_reuses_given_signatures_with_the_same_result(corpus):
    rng = np.random.default_rng(6)
    docs = corpus[:30] + [scattered_edit(d, 0.01, rng) for d in corpus[:10]]
    sigs = DocumentSignatures.from_documents(docs)
    assert np.array_equal(deduplicate(docs, 0.9, signatures=sigs)[0], deduplicate(docs, 0.9)[0])
    with pytest.raises(ValueError, match="signatures"):
        deduplicate(docs[:-1], 0.9, signatures=sigs)


def test_deduplicate_is_deterministic(corpus):
    rng = np.random.default_rng(7)
    docs = corpus[:100] + [line_edit(d, 0.05, rng) for d in corpus[:50]]
    first = deduplicate(docs, threshold=0.8)
    second = deduplicate(docs, threshold=0.8)
    assert np.array_equal(first[0], second[0]) and first[1] == second[1]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    copies=st.lists(st.tuples(st.integers(0, 19), st.sampled_from([0.0, 0.01, 0.05, 0.2])), max_size=15),
    threshold=st.sampled_from([0.5, 0.8, 0.9, 1.0]),
)
def test_deduplicating_the_kept_documents_again_drops_nothing(corpus, seed, copies, threshold):
    rng = np.random.default_rng(seed)
    docs = corpus[:20] + [scattered_edit(corpus[i], f, rng) for i, f in copies]
    order = rng.permutation(len(docs))
    docs = [docs[i] for i in order]
    kept, dropped = deduplicate(docs, threshold)
    assert kept.size + dropped == len(docs) and np.all(np.diff(kept) > 0)
    again, dropped_again = deduplicate([docs[i] for i in kept], threshold)
    assert dropped_again == 0 and again.tolist() == list(range(kept.size))


def test_band_params_recall_at_threshold_is_at_least_999_per_mille():
    for threshold in (0.5, 0.7, 0.8, 0.9, 0.95, 1.0):
        b, r = retrieval._band_params(threshold, 128)
        assert b * r <= 128 and 1 - (1 - threshold**r) ** b >= 0.999


# ---------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------


def test_top_k_for_a_slice_of_document_j_includes_j(corpus, retriever):
    rng = np.random.default_rng(8)
    misses = []
    for _ in range(200):
        j = int(rng.integers(len(corpus)))
        doc = corpus[j]
        length = int(round(rng.uniform(0.3, 0.5) * doc.size))
        start = int(rng.integers(0, doc.size - length + 1))
        result = retriever.top_k(doc[start : start + length], k=5)
        if j not in [d for d, _ in result]:
            misses.append(j)
    assert not misses


def test_top_k_scores_are_exact_jaccard_sorted_descending(corpus, retriever):
    query = corpus[10][50:250]
    result = retriever.top_k(query, k=8)
    assert len(result) == 8
    assert [s for _, s in result] == sorted((s for _, s in result), reverse=True)
    for doc_idx, score in result:
        assert score == pytest.approx(exact_jaccard(query, corpus[doc_idx]), abs=1e-12)


def test_top_k_returns_every_matching_document_when_k_exceeds_them():
    docs = [
        np.array([1, 2, 3, 4, 5, 6], dtype=np.int32),
        np.array([9, 1, 2, 3, 9, 9], dtype=np.int32),  # shares (1, 2, 3): J = 1 / (4 + 4 - 1)
        np.array([20, 21, 22, 23], dtype=np.int32),  # shares nothing
        np.zeros(0, dtype=np.int32),  # empty: never returned
        np.array([4, 5, 6, 30], dtype=np.int32),  # shares (4, 5, 6): J = 1 / (4 + 2 - 1)
    ]
    result = Retriever.from_documents(docs).top_k(np.array([1, 2, 3, 4, 5, 6]), k=10)
    assert result == [(0, 1.0), (4, 1 / 5), (1, 1 / 7)]


def test_top_k_with_no_shared_shingle_is_empty(retriever):
    assert retriever.top_k(np.array([500, 501, 502, 503], dtype=np.int32), k=3) == []


def test_containment_ranks_a_long_document_quoting_the_query_above_a_short_partial_match():
    rng = np.random.default_rng(10)
    long_doc = rng.permutation(5000)[:2000].astype(np.int32)  # distinct tokens: shingles are unambiguous
    query = long_doc[500:560]
    short_doc = np.concatenate([query[:40], rng.integers(6000, 7000, 10)]).astype(np.int32)
    r = Retriever.from_documents([short_doc, long_doc])
    by_jaccard = r.top_k(query, k=2)
    by_containment = r.top_k(query, k=2, score="containment")
    assert [d for d, _ in by_jaccard] == [0, 1]
    assert by_containment[0] == (1, 1.0) and by_containment[1] == (0, pytest.approx(38 / 58))


def test_containment_ties_are_broken_by_jaccard_then_doc_idx():
    base = np.arange(100, dtype=np.int32)
    docs = [np.concatenate([base, np.arange(1000, 1200)]), base.copy(), np.concatenate([base, [7, 7, 7]])]
    result = Retriever.from_documents(docs).top_k(base[10:50], k=3, score="containment")
    assert [d for d, _ in result] == [1, 2, 0] and all(s == 1.0 for _, s in result)


def test_signature_sizes_count_distinct_shingles(corpus):
    docs = corpus[:5] + [np.zeros(0, dtype=np.int32), np.array([3], dtype=np.int32)]
    sigs = DocumentSignatures.from_documents(docs)
    assert sigs.sizes.dtype == np.uint32 and sigs.sizes.tolist() == [shingles(d).size for d in docs]
    assert sigs.take([6, 0]).sizes.tolist() == [1, shingles(docs[0]).size]
    assert np.array_equal(sigs.take([6, 0]).matrix, sigs.matrix[[6, 0]])


def test_retriever_scores_the_candidates_from_the_tokens_fetch_returns(corpus):
    calls = []

    def fetch(doc_idx: int) -> np.ndarray:
        calls.append(doc_idx)
        return corpus[doc_idx]

    r = Retriever(DocumentSignatures.from_documents(corpus), fetch)
    first = r.top_k(corpus[0][:100], k=3)
    assert first[0] == (0, pytest.approx(exact_jaccard(corpus[0][:100], corpus[0])))
    assert 3 <= len(calls) <= 32 and set(d for d, _ in first) <= set(calls)  # max(4 k, 32) candidates
    # the signatures pick the candidates, the fetched tokens score them: other tokens, other scores
    blank = Retriever(r.signatures, lambda doc_idx: np.array([60_000 + doc_idx], dtype=np.int32))
    assert blank.top_k(corpus[0][:100], k=3) == []


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, True, 2.5, None])
def test_top_k_rejects_k_that_is_not_a_positive_int(retriever, k):
    with pytest.raises(ValueError, match="k must be"):
        retriever.top_k(np.array([1, 2, 3], dtype=np.int32), k)


def test_top_k_rejects_an_unknown_score(retriever):
    with pytest.raises(ValueError, match="score must be"):
        retriever.top_k(np.array([1, 2, 3], dtype=np.int32), 3, score="cosine")


def test_top_k_rejects_an_empty_query(retriever):
    with pytest.raises(ValueError, match="query_tokens"):
        retriever.top_k(np.zeros(0, dtype=np.int32), 3)


@pytest.mark.parametrize(
    "query,message",
    [
        (np.zeros((2, 3), dtype=np.int32), r"query_tokens must be a 1-D"),
        (np.array([1.0, 2.0]), r"query_tokens must hold integer"),
        (np.array([1, -4, 2], dtype=np.int32), r"query_tokens\[1\] = -4"),
        (np.array([1, 2**40], dtype=np.int64), r"query_tokens must be token ids in \[0, 2\*\*31\)"),
    ],
)
def test_top_k_rejects_malformed_query_tokens_naming_the_argument(retriever, query, message):
    with pytest.raises(ValueError, match=message):
        retriever.top_k(query, 3)


@pytest.mark.parametrize("threshold", [0, 0.0, -0.1, 1.0001, 2, float("nan"), "high", None])
def test_deduplicate_rejects_threshold_outside_0_1(corpus, threshold):
    with pytest.raises(ValueError, match="threshold"):
        deduplicate(corpus[:3], threshold=threshold)


def test_deduplicate_names_the_bad_document(corpus):
    with pytest.raises(ValueError, match=r"documents\[1\]"):
        deduplicate([corpus[0], np.array([[1, 2]])], threshold=0.9)


@pytest.mark.parametrize("n", [0, -1, True, 2.0, 65])
def test_shingles_rejects_bad_n(n):
    with pytest.raises(ValueError, match=r"^n \(shingle length\)"):
        shingles([1, 2, 3], n=n)


@pytest.mark.parametrize("num_perm", [0, 1, 5000, 64.0])
def test_signatures_reject_bad_num_perm(corpus, num_perm):
    with pytest.raises(ValueError, match="num_perm"):
        DocumentSignatures.from_documents(corpus[:2], num_perm=num_perm)
