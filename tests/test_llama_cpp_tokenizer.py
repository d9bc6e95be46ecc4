"""Specifies refdec.llama_cpp.tokenizer, ``GgufTokenizer``: a GGUF model's own tokenizer with the part
of the transformers interface refdec uses (encode / ``__call__`` with or without BOS, special
tokens written in the text parsed as such, decode, the vocabulary size, eos, the GGUF file's chat
template), and a fingerprint equal to the one of the tokenizer transformers reads from the same
file, so a corpus index built with that one drafts for the GGUF model. Tiny random GGUF model
(benchmarks/random_gguf.py: a byte vocabulary, byte b is id 4 + b); marked llama.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp")

import refdec  # noqa: E402
from refdec.drafting.index import CorpusIndex, tokenizer_fingerprint  # noqa: E402
from refdec.llama_cpp import tokenizer as gguf_tokenizer  # noqa: E402
from refdec.llama_cpp.tokenizer import GgufTokenizer  # noqa: E402
from benchmarks.random_gguf import BOS, EOS, VOCAB  # noqa: E402

pytestmark = pytest.mark.llama


def _byte(b: str) -> int:
    return 4 + ord(b)


def test_encode_gives_llama_cpps_ids_with_bos_when_asked(tiny_llm):
    tok = GgufTokenizer(tiny_llm)
    ids = tok.encode("ab")
    assert ids == [int(t) for t in tiny_llm.tokenize(b"ab", add_bos=True)]
    assert ids[0] == BOS and ids[-2:] == [_byte("a"), _byte("b")]
    assert tok.encode("ab", add_special_tokens=False) == ids[1:]
    # a special token written in the text is that token, not its characters
    assert tok.encode("<s>", add_special_tokens=False)[-1] == BOS


def test_call_gives_input_ids_as_a_list_or_a_tensor(tiny_llm):
    tok = GgufTokenizer(tiny_llm)
    assert tok("ab") == {"input_ids": tok.encode("ab")}
    tensor = tok("ab", return_tensors="pt")["input_ids"]
    assert tensor.dtype == torch.long and tensor.tolist() == [tok.encode("ab")]
    with pytest.raises(ValueError, match="return_tensors must be None or 'pt', got 'np'"):
        tok("ab", return_tensors="np")


def test_a_list_of_texts_gives_a_list_of_id_lists_so_a_corpus_index_builds(tiny_llm):
    from refdec.drafting.index import CorpusIndex

    tok = GgufTokenizer(tiny_llm)
    assert tok(["ab", "cde"], add_special_tokens=False) == {"input_ids": [tok.encode("ab", False),
                                                                          tok.encode("cde", False)]}
    with pytest.raises(ValueError, match="return_tensors must be None for a list"):
        tok(["ab"], return_tensors="pt")
    index = CorpusIndex.build(["hello world", "hello there"], tok, show_progress=False)
    assert index.num_documents == 2 and index.match_length(np.asarray(tok.encode("hello", False))) > 0


def test_decode_takes_lists_arrays_and_tensors_and_can_skip_special_tokens(tiny_llm):
    tok = GgufTokenizer(tiny_llm)
    ids = [BOS, _byte("a"), _byte("b")]
    assert tok.decode(ids) == "<s>ab"
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert tok.decode(np.array(ids)) == tok.decode(torch.tensor(ids)) == "<s>ab"


def test_vocabulary_eos_and_chat_template_are_the_gguf_files(tiny_llm, tiny_gguf):
    tok = GgufTokenizer(tiny_llm)
    assert len(tok) == VOCAB and tok.eos_token_id == EOS and tok.model_path == str(tiny_gguf)
    assert tok.chat_template.startswith("{% for m in messages %}")
    messages = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages)
    assert text == "<s>user: hi\nassistant: "
    assert tok.apply_chat_template(messages, tokenize=True) == tok.encode(text, add_special_tokens=False)
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == "<s>user: hi\n"


def test_the_fingerprint_is_transformers_reading_of_the_file_read_once(tiny_llm, tiny_gguf, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setattr(gguf_tokenizer, "_FINGERPRINTS", {})
    hf = AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    tok = GgufTokenizer(tiny_llm)
    assert tok.fingerprint() == tokenizer_fingerprint(hf)
    assert hf.encode("hello world") == tok.encode("hello world")
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("read the file again"))
    assert GgufTokenizer(tiny_llm).fingerprint() == tokenizer_fingerprint(hf)  # once per file
    # an index built with transformers' tokenizer of the file drafts for the GGUF model
    text = "def add(a, b):\n    return a + b\n" * 4
    index = CorpusIndex.build([text], tokenizer=hf, show_progress=False)
    prompt = tok.encode("def add(a, b):\n    return a")
    out = refdec.generate(tiny_llm, prompt, index=index, max_new_tokens=8, max_draft_tokens=8)
    assert out.stats.new_tokens == 8
