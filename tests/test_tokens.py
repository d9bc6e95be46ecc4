"""Specifies refdec.tokens, the one validator of token ids at refdec's boundary: ``as_token_ids``
takes a list or tuple of ints, a 1-D integer numpy array or a 1-D integer torch tensor, returns a
C-contiguous array of the asked dtype, and refuses anything else with a ValueError that names the
argument; ids lie in [0, 2**31), or in [0, vocab_size) when a vocabulary size is given."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from refdec.tokens import MAX_TOKEN_ID, as_token_ids, is_int


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
