"""Retrieval wired into the corpus index and the decoder.

* ``CorpusIndex.build(dedup_threshold=...)`` drops near-duplicates, keeps
  MinHash signatures one row per kept document, ``save`` writes them beside the
  index (``refdec.retrieval.signature_path``) and ``load`` finds them;
* ``generate(..., retrieve=k)`` adds the k documents most similar to the prompt
  to the per-request references: output unchanged (greedy equality), drafts
  from the retrieved documents;
* ``refdec index build --dedup`` / ``refdec generate --retrieve``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import refdec
from refdec.index import CorpusIndex
from refdec.proposer import Proposer
from refdec.retrieval import DocumentSignatures, signature_path
from tiny_models import VOCAB, tiny_llama


def _documents(count: int = 6, length: int = 300, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=length).astype(np.int32) for _ in range(count)]


def _near_copy(doc: np.ndarray) -> np.ndarray:
    """One token of 300 substituted: shingle Jaccard ~0.98."""
    out = doc.copy()
    out[150] = 3 if out[150] != 3 else 4
    return out


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=3)


# --------------------------------------------------------------------------- build, save, load


def test_dedup_at_build_drops_a_near_duplicate_and_an_exact_copy_and_keeps_distinct_documents():
    a, c, d = _documents(3)
    index = CorpusIndex.build([a, _near_copy(a), c, a.copy(), d], vocab_size=VOCAB, dedup_threshold=0.9,
                              show_progress=False)
    assert index.dropped_documents == 2
    assert index.num_documents == 3
    for doc_idx, want in enumerate([a, c, d]):
        assert np.array_equal(index.document(doc_idx), want)
    assert index.signatures == DocumentSignatures.from_documents([a, c, d])


def test_build_without_dedup_keeps_every_document_and_no_signatures_unless_asked():
    docs = _documents(3)
    plain = CorpusIndex.build(docs + [docs[0]], vocab_size=VOCAB, show_progress=False)
    assert plain.num_documents == 4 and plain.dropped_documents == 0 and plain.signatures is None
    signed = CorpusIndex.build(docs, vocab_size=VOCAB, signatures=True, show_progress=False)
    assert signed.num_documents == 3 and signed.signatures == DocumentSignatures.from_documents(docs)


def test_signatures_survive_save_and_load_in_the_sibling_file(tmp_path):
    docs = _documents(4)
    index = CorpusIndex.build(docs, vocab_size=VOCAB, dedup_threshold=0.9, show_progress=False)
    path = tmp_path / "corpus.idx"
    index.save(path)
    assert os.path.exists(signature_path(path))
    loaded = CorpusIndex.load(path)
    assert loaded.signatures == index.signatures
    hits = loaded.retriever().top_k(docs[2][40:100], 2, score="containment")
    assert hits[0] == (2, 1.0)


def test_saving_an_index_without_signatures_removes_a_stale_signature_file(tmp_path):
    path = tmp_path / "corpus.idx"
    CorpusIndex.build(_documents(3), vocab_size=VOCAB, signatures=True, show_progress=False).save(path)
    CorpusIndex.build(_documents(2, seed=1), vocab_size=VOCAB, show_progress=False).save(path)
    assert not os.path.exists(signature_path(path))
    with pytest.raises(ValueError, match="no MinHash signatures"):
        CorpusIndex.load(path).retriever()


def test_a_stale_signature_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "corpus.idx"
    CorpusIndex.build(_documents(3), vocab_size=VOCAB, signatures=True, show_progress=False).save(path)
    other = tmp_path / "other.idx"
    CorpusIndex.build(_documents(3, seed=9), vocab_size=VOCAB, signatures=True, show_progress=False).save(other)
    os.replace(signature_path(other), signature_path(path))  # same count, other documents
    with pytest.raises(ValueError, match="stale"):
        CorpusIndex.load(path).retriever()


def test_add_documents_extends_the_signatures_one_row_per_document():
    docs = _documents(4)
    index = CorpusIndex.build(docs[:2], vocab_size=VOCAB, signatures=True, show_progress=False)
    index.add_documents(docs[2:])
    assert index.signatures == DocumentSignatures.from_documents(docs)
    assert index.retriever().top_k(docs[3][:50], 1)[0][0] == 3


# --------------------------------------------------------------------------- generate(retrieve=k)


def _hf_greedy(model, prompt, max_new_tokens):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=None, pad_token_id=0, attention_mask=None)
    return out[0].tolist()


def test_retrieve_k_gives_greedy_output_and_the_retrieved_document_feeds_drafts(model):
    docs = _documents(6, seed=5)
    index = CorpusIndex.build(docs, vocab_size=VOCAB, signatures=True, show_progress=False)
    seen_refs = []

    def factory(index_, references, max_depth):
        seen_refs.append(list(references))
        return Proposer(index=index_, references=references or None, max_depth=max_depth)

    decoder = refdec.SpeculativeDecoder(model, index=index, proposer_factory=factory)
    for j in (1, 4):
        prompt = [1] + docs[j][30:90].tolist()  # a slice of document j
        want = _hf_greedy(model, prompt, 24)
        plain = decoder.generate(prompt, max_new_tokens=24, eos_token_id=[], max_draft_tokens=16)
        out = decoder.generate(prompt, max_new_tokens=24, eos_token_id=[], max_draft_tokens=16, retrieve=2)
        assert plain.sequences[0].tolist() == want
        assert out.sequences[0].tolist() == want
        assert out.stats.retrieved_documents[0] == j and len(out.stats.retrieved_documents) <= 2
        assert plain.stats.retrieved_documents == []
        # the retrieved document is a reference of the request's proposer ...
        assert any(np.array_equal(r, docs[j]) for r in seen_refs[-1])
        # ... and drafts its continuation of the prompt from the reference source
        proposer = factory(index, seen_refs[-1], 64)
        proposer.start(np.asarray(prompt, dtype=np.int32))
        tree = proposer.propose(16)
        names = [tree.source_names[s] for s in tree.source_ids]
        chain = tree.token_ids[tree.parents < 0]
        assert "reference" in names and docs[j][90] in chain.tolist()


def test_retrieve_through_the_module_level_generate(model):
    docs = _documents(4, seed=6)
    index = CorpusIndex.build(docs, vocab_size=VOCAB, signatures=True, show_progress=False)
    prompt = [1] + docs[2][10:50].tolist()
    out = refdec.generate(model, prompt, index=index, max_new_tokens=12, eos_token_id=[], retrieve=1)
    assert out.sequences[0].tolist() == _hf_greedy(model, prompt, 12)
    assert out.stats.retrieved_documents == [2]


def test_retrieve_without_index_or_without_signatures_or_negative_is_a_clear_error(model):
    decoder = refdec.SpeculativeDecoder(model)
    with pytest.raises(ValueError, match="needs a corpus index"):
        decoder.generate([1, 5, 6], max_new_tokens=2, retrieve=1)
    unsigned = CorpusIndex.build(_documents(2), vocab_size=VOCAB, show_progress=False)
    with pytest.raises(ValueError, match="no MinHash signatures"):
        decoder.generate([1, 5, 6], index=unsigned, max_new_tokens=2, retrieve=1)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="retrieve"):
            decoder.generate([1, 5, 6], index=unsigned, max_new_tokens=2, retrieve=bad)
    # retrieve=0 (the default) needs no signatures
    assert decoder.generate([1, 5, 6], index=unsigned, max_new_tokens=2, retrieve=0).stats.new_tokens == 2


# --------------------------------------------------------------------------- CLI


def test_cli_build_dedup_reports_the_dropped_documents_and_writes_signatures(capsys, tmp_path):
    from refdec.cli import main
    from test_cli_index import make_tiny_tokenizer

    make_tiny_tokenizer(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    body = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(40))
    (src / "a.py").write_text(body)
    (src / "a_copy.py").write_text(body)
    (src / "a_edited.py").write_text(body.replace("x + 7\n", "x + 8\n"))
    (src / "b.py").write_text("import os\nprint('hello world')\n" * 5)
    out = tmp_path / "corpus.idx"
    code = main(["index", "build", str(src), "--tokenizer", str(tmp_path / "tok"), "--out", str(out),
                 "--dedup", "0.9", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "2 documents," in printed and "2 near-duplicate documents dropped (Jaccard >= 0.9)" in printed
    assert os.path.exists(signature_path(out)) and "signatures in" in printed
    assert CorpusIndex.load(out).signatures is not None

    code = main(["index", "info", str(out)])
    assert code == 0 and signature_path(out) in capsys.readouterr().out

    plain = tmp_path / "plain.idx"
    code = main(["index", "build", str(src), "--tokenizer", str(tmp_path / "tok"), "--out", str(plain),
                 "--no-signatures", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0 and "4 documents," in printed and "dropped" not in printed
    assert not os.path.exists(signature_path(plain))


def test_cli_dedup_threshold_out_of_range_is_an_argument_error(capsys, tmp_path):
    from refdec.cli import main

    with pytest.raises(SystemExit):
        main(["index", "build", str(tmp_path), "--out", str(tmp_path / "x.idx"), "--dedup", "1.5"])
    assert "(0, 1]" in capsys.readouterr().err


def test_cli_generate_retrieve_without_index_is_an_error_before_loading_a_model(capsys):
    from refdec.cli import main

    code = main(["generate", "--prompt", "x", "--retrieve", "2", "--model", "/nonexistent"])
    assert code != 0 and "--retrieve 2 needs --index" in capsys.readouterr().err
