"""Wrapping a vLLM method once: refdec's hooks into vLLM (refdec.vllm.plugin, the proposer's
runner hook) replace a method by a wrapper around it, and a second install is a no-op."""

from __future__ import annotations

import functools

__all__ = ["wrap_once"]

_HOOK_FLAG = "_refdec_hook"


def wrap_once(owner, name: str, make):
    """Replaces ``owner.name`` by ``make(original)`` once (a second call is a no-op)."""
    original = getattr(owner, name)
    if getattr(original, _HOOK_FLAG, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _HOOK_FLAG, True)
    setattr(owner, name, wrapper)
