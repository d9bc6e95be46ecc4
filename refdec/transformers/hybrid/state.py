"""Where a hybrid model's recurrent state lives in refdec's cache, and how rows move it.

A recurrent layer (Gated DeltaNet, a Mamba2 mixer, a short convolution) keeps, per batch row,
a convolution window (the last ``K`` inputs of its causal convolution) and, except a bare
convolution, a recurrent state. refdec keeps them in transformers' own
``LinearAttentionLayer`` (:class:`RecurrentLayer`), so that the model's code prefills them
as it always does; a layer with attention and a recurrent mixer side by side (Falcon-H1,
Zamba2's hybrid layers) is a :class:`GrowingRecurrentLayer`, a refdec KV layer as well.

While a tree is verified (refdec.transformers.hybrid.step), the layer's state is read, never
written: each tree function records a *pending commit* on the layer instead, a function of
each row's accepted tree row. :func:`commit_states` runs them once the walks know what was
accepted: the state becomes the accepted node's, computed from what the forward already
produced, with nothing run again.

The row API here mirrors refdec.transformers.cache's for the KV layers: rows appended
(:func:`append_state_rows`), kept (:func:`select_state_rows`), copied out for the prefix cache
(:func:`row_states`) and back into a new cache (:func:`restore_row_states`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers.cache_utils import LinearAttentionLayer

from refdec.transformers.cache import GrowingLayer, _GrowingCache

__all__ = ["KV_LAYER_TYPES", "GrowingRecurrentLayer", "RecurrentLayer", "append_state_rows", "commit_states", "has_pending",
           "new_hybrid_cache", "recurrent_layers", "restore_row_states", "row_states", "RowState",
           "select_state_rows", "state_bytes"]

# A pending commit: ``commit(final_rows)`` with ``final_rows`` int64 [B] (each row's accepted tree row:
# 0 = the root, ``1 + i`` = node i) writes the state of that row into the layer.
Commit = Callable[[torch.Tensor], None]


class RecurrentLayer(LinearAttentionLayer):
    """transformers' ``LinearAttentionLayer`` (conv windows ``conv_states[i]`` float [B, C, K], recurrent
    states ``recurrent_states[i]`` [B, ...]) that a tree step does not write: while ``frozen``, an
    update of the recurrent state records the pending commit the tree function returned
    (refdec.transformers.hybrid.step), and the tree functions record theirs in ``pending``."""

    refdec_recurrent = True  # refdec.transformers.cache.layers skips it unless it holds KV entries too

    def __init__(self, number_of_states: int = 1, **kwargs) -> None:
        super().__init__(number_of_states=number_of_states)
        self.frozen = False
        self.pending: list[Commit] = []

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size=None, **kwargs):
        if self.frozen:
            raise RuntimeError("refdec: a tree step reached transformers' own causal convolution; "
                               "refdec.transformers.hybrid.step must replace it")
        return super().update_conv_state(conv_states, state_idx, conv_kernel_size=conv_kernel_size, **kwargs)

    def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs):
        if self.frozen:
            if not callable(recurrent_states):
                raise RuntimeError("refdec: a tree step reached transformers' own recurrence; "
                                   "refdec.transformers.hybrid.step must replace it")
            self.pending.append(recurrent_states)
            return None
        return super().update_recurrent_state(recurrent_states, state_idx, **kwargs)

    def state_tensors(self):
        """(kind, index, tensor) of every initialised conv window and recurrent state."""
        for i in range(self.number_of_states):
            if self.is_conv_states_initialized[i]:
                yield "conv", i, self.conv_states[i]
            if self.is_recurrent_states_initialized[i]:
                yield "recurrent", i, self.recurrent_states[i]

    def set_state(self, kind: str, index: int, tensor: torch.Tensor) -> None:
        (self.conv_states if kind == "conv" else self.recurrent_states)[index] = tensor


class GrowingRecurrentLayer(RecurrentLayer, GrowingLayer):
    """A layer with both a recurrent mixer and attention (transformers' ``hybrid`` layer type):
    refdec's KV layer (:class:`~refdec.transformers.cache.GrowingLayer`) and a :class:`RecurrentLayer`."""

    is_compileable = False

    def __init__(self, number_of_states: int = 1, **kwargs) -> None:
        GrowingLayer.__init__(self)
        RecurrentLayer.__init__(self, number_of_states=number_of_states)

    def lazy_initialization(self, *args, **kwargs) -> None:
        if len(args) == 2 and not kwargs:  # the KV part (update(keys, values))
            GrowingLayer.lazy_initialization(self, *args)
        else:
            RecurrentLayer.lazy_initialization(self, **kwargs)

    def get_seq_length(self) -> int:
        return GrowingLayer.get_seq_length(self)

    def reset(self) -> None:
        RecurrentLayer.reset(self)
        GrowingLayer.reset(self)


# transformers' cache layer types (config.layer_types) -> refdec's layer class
_LAYER_CLASSES = {"full_attention": GrowingLayer, "linear_attention": RecurrentLayer, "conv": RecurrentLayer,
                  "mamba": RecurrentLayer, "hybrid": GrowingRecurrentLayer,
                  "dummy": GrowingLayer}  # a layer that caches nothing (never initialised, skipped)


# the cache layer types that hold KV entries (refdec.transformers.cache.layers yields them, in order)
KV_LAYER_TYPES = frozenset({"full_attention", "hybrid"})


def new_hybrid_cache(layer_types: list[str]) -> _GrowingCache:
    """An empty cache with one layer per entry of ``layer_types`` (a hybrid model's cache layer
    types, refdec.transformers.hybrid.families.cache_layer_types): refdec's never-evicting KV layers
    for attention, :class:`RecurrentLayer` / :class:`GrowingRecurrentLayer` for the rest."""
    cache = _GrowingCache()
    for layer_type in layer_types:
        if layer_type not in _LAYER_CLASSES:
            raise ValueError(f"cache layer type {layer_type!r} has no refdec layer (known: {sorted(_LAYER_CLASSES)})")
        cache.layers.append(_LAYER_CLASSES[layer_type]())
    return cache


def recurrent_layers(cache) -> list[RecurrentLayer]:
    """The cache's recurrent layers (none for an attention-only model's cache)."""
    return [layer for layer in cache.layers if isinstance(layer, RecurrentLayer)]


def has_pending(cache) -> bool:
    return any(layer.pending for layer in recurrent_layers(cache))


def commit_states(cache, final_rows: torch.Tensor) -> None:
    """Each recurrent layer's state becomes that of each row's accepted tree row (``final_rows``
    int64 [B] on the cache's device: 0 = the root, ``1 + i`` = node i): the pending commits of the
    step run and are dropped."""
    for layer in recurrent_layers(cache):
        for commit in layer.pending:
            commit(final_rows.to(_device(layer, final_rows)))
        layer.pending = []


def discard_pending(cache) -> None:
    """Drops a step's pending commits (the states stay those before the step)."""
    for layer in recurrent_layers(cache):
        layer.pending = []


def _device(layer: RecurrentLayer, fallback: torch.Tensor) -> torch.device:
    for _, _, tensor in layer.state_tensors():
        return tensor.device
    return fallback.device


def append_state_rows(cache, other) -> None:
    """Appends the recurrent rows of ``other`` (a cache of the same model) after those of ``cache``."""
    for layer, extra in zip(recurrent_layers(cache), recurrent_layers(other)):
        theirs = {(kind, i): tensor for kind, i, tensor in extra.state_tensors()}
        for kind, i, tensor in list(layer.state_tensors()):
            layer.set_state(kind, i, torch.cat([tensor, theirs[(kind, i)]]))


def select_state_rows(cache, rows: torch.Tensor) -> None:
    """Keeps the recurrent rows ``rows`` (int64 [B'])."""
    for layer in recurrent_layers(cache):
        for kind, i, tensor in list(layer.state_tensors()):
            layer.set_state(kind, i, tensor.index_select(0, rows.to(tensor.device)))


# a recurrent layer's bookkeeping beside its tensors (transformers' LinearAttentionCacheLayerMixin), per state index
_STATE_FLAGS = ("is_conv_states_initialized", "is_recurrent_states_initialized", "has_previous_state",
                "conv_kernel_size")


@dataclass
class RowState:
    """One recurrent layer's state for one row: ``tensors[(kind, index)]`` float [1, ...] (copies of
    the layer's conv windows and recurrent states), ``flags`` the layer's per-state bookkeeping."""

    tensors: dict
    flags: dict
    dtype: torch.dtype | None
    device: torch.device | None

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors.values())


def row_states(cache, row: int) -> list[RowState]:
    """Copies of batch row ``row``'s state in every recurrent layer (a prefix-cache entry's)."""
    return [RowState({(kind, i): tensor[row:row + 1].clone() for kind, i, tensor in layer.state_tensors()},
                     {name: dict(getattr(layer, name)) for name in _STATE_FLAGS}, layer.dtype, layer.device)
            for layer in recurrent_layers(cache)]


def restore_row_states(cache, states: list[RowState], length: int) -> None:
    """Sets the recurrent layers of ``cache`` (a new one-row cache of the same model) to ``states``
    (:func:`row_states`, the state after ``length`` tokens), copied. The layers' token count is
    ``length``: transformers reads a cache's length from its first layer (the positions of what is fed
    next), which in a hybrid is often a recurrent one."""
    layers = recurrent_layers(cache)
    if len(layers) != len(states):
        raise ValueError(f"states for {len(states)} recurrent layers given to a cache with {len(layers)}")
    for layer, state in zip(layers, states):
        for name, value in state.flags.items():
            setattr(layer, name, dict(value))
        for (kind, i), tensor in state.tensors.items():
            layer.set_state(kind, i, tensor.clone())
        layer.dtype, layer.device = state.dtype, state.device
        layer.cumulative_length_linear = torch.tensor(int(length), device=state.device)


def state_bytes(cache) -> int:
    """Bytes of every recurrent layer's conv windows and states."""
    return sum(tensor.nbytes for layer in recurrent_layers(cache) for _, _, tensor in layer.state_tensors())
