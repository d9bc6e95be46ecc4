"""Specifies refdec.decode, the deprecated alias of the engine's 0.1 layout: each old module path
(refdec.decode.<name>) is the module it moved to in refdec.engine or refdec.transformers, the
same object, with a DeprecationWarning; a name that never existed there is not found."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import refdec.decode


@pytest.mark.parametrize("name, new", sorted(refdec.decode.MOVED.items()))
def test_an_old_path_is_the_moved_module_with_a_warning(name, new):
    sys.modules.pop(f"refdec.decode.{name}", None)
    with pytest.warns(DeprecationWarning, match=f"refdec.decode.{name} is deprecated: import {new}"):
        old = importlib.import_module(f"refdec.decode.{name}")
    assert old is importlib.import_module(new)


def test_the_alias_covers_exactly_the_modules_the_old_package_had():
    package = Path(refdec.decode.__file__).resolve().parents[1]
    new_since = {"__init__", "interface", "calibration", "service", "prefix_cache"}  # not in refdec/decode/ before
    moved = {path.stem: f"refdec.{folder}.{path.stem}" for folder in ("engine", "transformers")
             for path in (package / folder).glob("*.py") if path.stem not in new_since}
    assert refdec.decode.MOVED == moved


def test_a_name_the_old_package_never_had_is_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("refdec.decode.interface")
    with pytest.raises(AttributeError):
        refdec.decode.nothing
