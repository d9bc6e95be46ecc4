"""Token ids at the boundary: the one validator every entry point uses.

Token ids are integers in ``[0, 2**31)`` (the C++ core stores int32; Gemma's
vocabulary of 262,144 does not fit 16 bits), and below the model's vocabulary
size where one is known. A sequence of them arrives as a list or tuple of ints,
a 1-D numpy integer array or a 1-D torch integer tensor; strings, floats, bools
and nested shapes are refused with a message that names the argument.

An integer argument (a count, a size, an index) is checked by :func:`check_int`:
a Python or numpy integer, never a bool.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["MAX_TOKEN_ID", "as_token_ids", "check_int", "is_int"]

MAX_TOKEN_ID = 2**31 - 1


def is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value, lowest: int | None = None, highest: int | None = None) -> int:
    """``value`` as an int: an integer (Python or numpy, not a bool) in ``[lowest, highest]``
    (None = unbounded). Anything else is a ValueError naming ``name``, the value and the range."""
    if (type(value) is int or is_int(value)) and (lowest is None or value >= lowest) and (  # type(): fast path
            highest is None or value <= highest):
        return int(value)
    if highest is None:
        expected = "an int" if lowest is None else f"an int >= {lowest}"
    else:
        expected = f"an int <= {highest}" if lowest is None else f"an int in [{lowest}, {highest}]"
    raise ValueError(f"{name} must be {expected}, got {value!r}")


def as_token_ids(tokens, name: str = "tokens", *, vocab_size: int | None = None, dtype=np.int32) -> np.ndarray:
    """``tokens`` validated, as a C-contiguous array of shape (n,) and ``dtype`` (int32 or int64).

    Raises ValueError naming ``name`` for a str, a non-integer dtype or element, a shape other
    than 1-D, or an id outside ``[0, 2**31)`` (``[0, vocab_size)`` when given)."""
    if isinstance(tokens, np.ndarray) and tokens.dtype == dtype and tokens.ndim == 1 and vocab_size is None:
        # the hot path (a proposer's accept): one reduction, no copy
        if tokens.size and int(tokens.min()) < 0:
            _raise_out_of_range(tokens, name, None)
        if dtype == np.int64 and tokens.size and int(tokens.max()) > MAX_TOKEN_ID:
            _raise_out_of_range(tokens, name, None)
        return np.ascontiguousarray(tokens)
    arr = _to_numpy(tokens, name)
    if arr.size == 0:
        return np.zeros(0, dtype=dtype)
    bad = (arr < 0) | (arr > (MAX_TOKEN_ID if vocab_size is None else vocab_size - 1))
    if bad.any():
        _raise_out_of_range(arr, name, vocab_size)
    return np.ascontiguousarray(arr, dtype=dtype)


def _to_numpy(tokens, name: str) -> np.ndarray:
    """A 1-D integer numpy array holding ``tokens`` (no range check)."""
    if isinstance(tokens, (str, bytes)):
        raise ValueError(f"{name} must be a sequence of token ids, got {type(tokens).__name__} "
                         f"(tokenize the text first)")
    if type(tokens).__module__.startswith("torch"):
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or str(tokens.dtype) == "torch.bool":
            raise ValueError(f"{name} must hold integer token ids, got a tensor of dtype {tokens.dtype}")
        tokens = tokens.detach().cpu().numpy()
    if isinstance(tokens, (list, tuple)):
        bad = [t for t in tokens if not is_int(t)][:1]
        if bad:
            raise ValueError(f"{name} must be a list of ints; found {bad[0]!r}")
        arr = np.asarray(tokens, dtype=np.int64) if tokens else np.zeros(0, dtype=np.int64)
    elif isinstance(tokens, np.ndarray):
        arr = tokens
        if arr.size and arr.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    else:
        raise ValueError(f"{name} must be a list of ints, a 1-D integer array or tensor, got {type(tokens).__name__}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {tuple(arr.shape)}")
    return arr


def _raise_out_of_range(arr: np.ndarray, name: str, vocab_size: int | None):
    high = MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
    pos = int(np.flatnonzero((arr < 0) | (arr > high))[0])
    if vocab_size is None:
        raise ValueError(f"{name} must be token ids in [0, 2**31); {name}[{pos}] = {int(arr[pos])}")
    raise ValueError(f"{name} holds token id {int(arr[pos])}, outside the model vocabulary [0, {vocab_size})")
