"""Specifies refdec.tokens, the one validator of token ids at refdec's boundary: ``as_token_ids``
takes a list or tuple of ints, a 1-D integer numpy array or a 1-D integer torch tensor, returns a
C-contiguous array of the asked dtype, and refuses anything else with a ValueError that names the
argument; ids lie in [0, 2**31), or in [0, vocab_size) when a vocabulary size is given. An integer
argument is checked by ``check_int`` (``is_int``): a Python or numpy integer, never a bool."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from refdec.drafting.index import CorpusIndex
from refdec.drafting.proposer import Proposer
from refdec.sizing.acceptance import AcceptanceTable
from refdec.sizing.budget import AutoBudget
from refdec.sizing.cost_curve import CostCurve
from refdec.tokens import MAX_TOKEN_ID, as_token_ids, check_int, is_int
from refdec.transformers.cache import new_cache, set_prefill_window
from refdec.vllm.options import speculative_config


@pytest.mark.parametrize("tokens", [[5, 0, 7], (5, 0, 7), [np.int64(5), np.int32(0), 7], np.array([5, 0, 7], np.int16),
                                    np.array([5, 0, 7], np.uint8), np.array([5, 0, 7], np.int64),
                                    torch.tensor([5, 0, 7]), torch.tensor([5, 0, 7], dtype=torch.int32)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_every_accepted_form_gives_a_contiguous_array_of_the_asked_dtype(tokens, dtype):
    out = as_token_ids(tokens, dtype=dtype)
    assert out.dtype == dtype and out.ndim == 1 and out.flags.c_contiguous and out.tolist() == [5, 0, 7]


@pytest.mark.parametrize("tokens", [[], (), np.zeros(0, np.int64), np.zeros(0, np.float64),
                                    torch.zeros(0, dtype=torch.long)])
def test_an_empty_sequence_is_an_empty_array(tokens):
    out = as_token_ids(tokens, dtype=np.int64)
    assert out.shape == (0,) and out.dtype == np.int64


def test_an_array_already_in_the_asked_form_is_returned_without_a_copy():
    arr = np.array([3, 4, 5], dtype=np.int32)
    assert as_token_ids(arr) is arr
    strided = np.arange(10, dtype=np.int32)[::2]  # the asked dtype but not contiguous: a contiguous copy
    out = as_token_ids(strided)
    assert out.flags.c_contiguous and out.tolist() == [0, 2, 4, 6, 8]


@pytest.mark.parametrize("tokens, message", [
    ("5 6 7", r"ids must be a sequence of token ids, got str \(tokenize the text first\)"),
    (b"567", r"ids must be a sequence of token ids, got bytes"),
    ([5, 6.0], r"ids must be a list of ints; found 6.0"),
    ([5, True], r"ids must be a list of ints; found True"),
    ((5, "6"), r"ids must be a list of ints; found '6'"),
    ([[5, 6], [7, 8]], r"ids must be a list of ints; found \[5, 6\]"),
    (torch.tensor([5.0, 6.0]), r"ids must hold integer token ids, got a tensor of dtype torch.float32"),
    (torch.tensor([True, False]), r"ids must hold integer token ids, got a tensor of dtype torch.bool"),
    (torch.tensor([1 + 2j]), r"ids must hold integer token ids, got a tensor of dtype torch.complex64"),
    (np.array([5.0, 6.0]), r"ids must hold integer token ids, got dtype float64"),
    (np.array([True]), r"ids must hold integer token ids, got dtype bool"),
    (np.array([[5, 6], [7, 8]]), r"ids must be a 1-D sequence of token ids, got shape \(2, 2\)"),
    (np.int64(5), r"ids must be a list of ints, a 1-D integer array or tensor, got int64"),
    (torch.tensor([[5, 6]]), r"ids must be a 1-D sequence of token ids, got shape \(1, 2\)"),
    ({5, 6}, r"ids must be a list of ints, a 1-D integer array or tensor, got set"),
    (5, r"ids must be a list of ints, a 1-D integer array or tensor, got int"),
    (iter([5, 6]), r"ids must be a list of ints, a 1-D integer array or tensor, got list_iterator"),
])
def test_a_malformed_sequence_is_an_error_naming_the_argument(tokens, message):
    with pytest.raises(ValueError, match=message):
        as_token_ids(tokens, "ids")


@pytest.mark.parametrize("tokens, dtype", [([5, -1], np.int32), (np.array([5, -1], np.int32), np.int32),
                                           (np.array([5, -1], np.int64), np.int64), (torch.tensor([5, -1]), np.int64)])
def test_a_negative_id_is_an_error_naming_its_position(tokens, dtype):
    with pytest.raises(ValueError, match=r"ids must be token ids in \[0, 2\*\*31\); ids\[1\] = -1"):
        as_token_ids(tokens, "ids", dtype=dtype)


@pytest.mark.parametrize("tokens", [[0, MAX_TOKEN_ID + 1], np.array([0, MAX_TOKEN_ID + 1], np.int64),
                                    np.array([0, 2**32], np.uint64)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_an_id_past_2_31_is_an_error_whatever_the_dtype(tokens, dtype):
    with pytest.raises(ValueError, match=rf"ids must be token ids in \[0, 2\*\*31\); ids\[1\] = {int(tokens[1])}"):
        as_token_ids(tokens, "ids", dtype=dtype)
    assert as_token_ids([0, MAX_TOKEN_ID], dtype=dtype).tolist() == [0, MAX_TOKEN_ID]  # the largest id is fine


@pytest.mark.parametrize("tokens", [[3, 96], np.array([3, 96], np.int32), torch.tensor([3, 96])])
def test_with_a_vocabulary_size_an_id_outside_it_is_an_error_naming_the_id(tokens):
    with pytest.raises(ValueError, match=r"prompt holds token id 96, outside the model vocabulary \[0, 96\)"):
        as_token_ids(tokens, "prompt", vocab_size=96)
    with pytest.raises(ValueError, match=r"prompt holds token id -2, outside the model vocabulary \[0, 96\)"):
        as_token_ids([3, -2], "prompt", vocab_size=96)
    assert as_token_ids([0, 95], "prompt", vocab_size=96).tolist() == [0, 95]


def test_the_default_name_is_tokens():
    with pytest.raises(ValueError, match=r"^tokens must be a list of ints; found 'x'$"):
        as_token_ids([5, "x"])


def test_a_none_in_a_list_is_an_error_naming_the_argument():
    with pytest.raises(ValueError, match=r"ids must be a list of ints; found None"):
        as_token_ids([5, None], "ids")


@pytest.mark.parametrize("value, expected", [(3, True), (np.int64(3), True), (np.uint8(3), True), (-1, True),
                                             (True, False), (np.bool_(True), False), (3.0, False), ("3", False),
                                             (None, False)])
def test_is_int_accepts_python_and_numpy_integers_but_not_bools(value, expected):
    assert is_int(value) is expected


@pytest.mark.parametrize("value, lowest, highest, message", [
    (True, None, None, r"n must be an int, got True"),
    (2.0, 0, None, r"n must be an int >= 0, got 2.0"),
    (-1, 0, None, r"n must be an int >= 0, got -1"),
    (np.int64(9), None, 8, r"n must be an int <= 8, got np.int64\(9\)"),
    ("3", 1, 8, r"n must be an int in \[1, 8\], got '3'"),
    (None, 1, 8, r"n must be an int in \[1, 8\], got None"),
])
def test_check_int_refuses_anything_but_an_integer_in_range_naming_the_argument_the_value_and_the_range(
        value, lowest, highest, message):
    with pytest.raises(ValueError, match=message):
        check_int("n", value, lowest, highest)


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), np.int32(3)])
def test_check_int_returns_a_python_int(value):
    out = check_int("n", value, 0, 3)
    assert out == 3 and type(out) is int


def _corpus_document(doc_idx):
    return CorpusIndex.build([[0], [0]], show_progress=False).document(doc_idx)


# Every integer argument means the same (check_int / is_int): a Python or numpy integer, never a
# bool or a float, refused with a message naming the argument and the value.
INTEGER_ARGUMENTS = {
    "max_nodes": lambda v: AutoBudget(max_nodes=v),
    "n_sources": lambda v: AcceptanceTable(n_sources=v),
    "max_depth": lambda v: Proposer(max_depth=v),
    "backoff": lambda v: Proposer(backoff=v),
    "vocab_size": lambda v: CorpusIndex.build([[0]], vocab_size=v, show_progress=False),
    "doc_idx": _corpus_document,
    "head_chunk_rows": lambda v: CostCurve((0, 1), (1.0, 1.0), None, 0.1, v),
    "window": lambda v: set_prefill_window(new_cache(), [], v),
    "num_speculative_tokens": speculative_config,
}


@pytest.mark.parametrize("name", INTEGER_ARGUMENTS)
def test_every_integer_argument_takes_numpy_integers_and_refuses_bools_and_floats(name):
    call = INTEGER_ARGUMENTS[name]
    call(np.int64(1))
    for bad in (True, 1.0):
        with pytest.raises(ValueError, match=rf"{name} must be an int.*, got {bad!r}"):
            call(bad)


def test_a_numpy_num_speculative_tokens_gives_a_json_config():
    assert json.loads(json.dumps(speculative_config(np.int64(8))))["num_speculative_tokens"] == 8
