"""A verification forward through a hybrid model's own code, its recurrent kernels swapped for
refdec's tree forms.

transformers writes each recurrent mixer (Gated DeltaNet, the Mamba2 mixers, LFM2's short
convolution) around a few module-level functions that own the state: the causal convolution
(``causal_conv1d_forward``), the gated delta rule (``torch_chunk_gated_delta_rule``,
``torch_recurrent_gated_delta_rule``), the Mamba2 scan (``mamba2_scan_forward``) -- the functions
transformers' kernel hub swaps for fused kernels. :func:`install` wraps those of a model's modeling
module once: outside refdec's tree step a wrapper calls the original, so the model decodes as
before everywhere else (``model.generate`` included); inside :func:`tree_step` (a context
variable: the step's thread only) it runs the tree form of refdec.transformers.hybrid.conv,
.delta_rule or .ssd with the step's :class:`~refdec.transformers.hybrid.paths.TreePaths`, and the
cache's recurrent layers are frozen: they record pending commits instead of new states
(refdec.transformers.hybrid.state).

The projections, norms, gates and MLPs around the kernels are the model's own code, over the
step's ``T`` rows at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys

from refdec.transformers.hybrid.conv import tree_conv1d_forward
from refdec.transformers.hybrid.delta_rule import tree_gated_delta_rule
from refdec.transformers.hybrid.paths import TreePaths
from refdec.transformers.hybrid.ssd import tree_mamba2_scan_forward
from refdec.transformers.hybrid.state import discard_pending, recurrent_layers

__all__ = ["TREE_FORMS", "install", "tree_step"]

# The function names a modeling module's recurrent mixers call, and refdec's tree form of each.
TREE_FORMS = {
    "causal_conv1d_forward": tree_conv1d_forward,
    "torch_chunk_gated_delta_rule": tree_gated_delta_rule,
    "torch_recurrent_gated_delta_rule": tree_gated_delta_rule,
    "mamba2_scan_forward": tree_mamba2_scan_forward,
}

_ACTIVE: contextvars.ContextVar[TreePaths | None] = contextvars.ContextVar("refdec_tree_paths", default=None)


def _wrap(original, tree_form):
    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        paths = _ACTIVE.get()
        if paths is None:
            return original(*args, **kwargs)
        return tree_form(paths, *args, **kwargs)

    dispatch.__refdec_tree_form__ = tree_form
    dispatch.__wrapped_original__ = original
    return dispatch


def install(module_names: set[str]) -> None:
    """Wraps the :data:`TREE_FORMS` functions of each modeling module in ``module_names`` (imported
    already: a model of it exists), once per module."""
    for name in sorted(module_names):
        module = sys.modules[name]
        for function_name, tree_form in TREE_FORMS.items():
            original = getattr(module, function_name, None)
            if original is None or getattr(original, "__refdec_tree_form__", None) is not None:
                continue
            setattr(module, function_name, _wrap(original, tree_form))


@contextlib.contextmanager
def tree_step(cache, paths: TreePaths):
    """Inside: the wrapped kernels run their tree forms over ``paths`` and ``cache``'s recurrent
    layers record pending commits (refdec.transformers.hybrid.state.commit_states runs them). If the
    forward raises, the pending commits are dropped: the states stay those before the step."""
    layers = recurrent_layers(cache)
    discard_pending(cache)  # a step never committed (a timed calibration step) leaves the states as they were
    token = _ACTIVE.set(paths)
    for layer in layers:
        layer.frozen = True
    try:
        yield
    except BaseException:
        discard_pending(cache)
        raise
    finally:
        for layer in layers:
            layer.frozen = False
        _ACTIVE.reset(token)
