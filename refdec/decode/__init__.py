"""Deprecated: the 0.1 name of the engine, kept as an alias for one release.

``refdec.decode.<module>`` is ``refdec.engine.<module>`` (the loop and what every backend shares)
or ``refdec.transformers.<module>`` (the transformers backend); importing it through this name
warns (DeprecationWarning) and gives the same module object. Import from the new packages.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_ENGINE = ("accept", "arguments", "decoder", "drafts", "engine", "processors", "requests", "results", "sampling",
           "scheduler", "stops")
_TRANSFORMERS = ("backend", "batch", "cache", "lazy_head", "masks", "model_support", "plain_head", "prefill",
                 "runner", "selfcheck", "static_step", "transfer", "verify")
MOVED = {name: f"refdec.engine.{name}" for name in _ENGINE} | {name: f"refdec.transformers.{name}"
                                                                 for name in _TRANSFORMERS}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``refdec.decode.<old>`` as the module it moved to."""

    def find_spec(self, fullname, path, target=None):
        prefix, _, name = fullname.rpartition(".")
        if prefix == __name__ and name in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        name = spec.name.rpartition(".")[2]
        warnings.warn(f"{spec.name} is deprecated: import {MOVED[name]}", DeprecationWarning, stacklevel=3)
        return importlib.import_module(MOVED[name])

    def exec_module(self, module) -> None:
        pass


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.append(_AliasFinder())


def __getattr__(name: str):
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
