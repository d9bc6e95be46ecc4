"""Specifies refdec.vllm.hooks, ``wrap_once``: a vLLM method replaced by a wrapper around it keeps
the method's name and docstring, and installing a hook again (vLLM runs refdec's plugin in every
process, maybe more than once) wraps nothing twice. No vLLM needed."""

from __future__ import annotations

from refdec.vllm.hooks import wrap_once


class Owner:
    def method(self, x):
        """The original's docstring."""
        return x + 1


def _recording(calls):
    def make(original):
        def wrapper(self, x):
            calls.append(x)
            return 10 * original(self, x)
        return wrapper
    return make


def test_the_method_is_replaced_by_the_wrapper_around_the_original():
    owner = type("Fresh", (Owner,), {})
    calls = []
    wrap_once(owner, "method", _recording(calls))
    assert owner().method(1) == 20 and calls == [1]
    assert owner.method.__name__ == "method" and owner.method.__doc__ == "The original's docstring."
    assert Owner().method(1) == 2  # the class it was inherited from is left alone


def test_a_second_install_wraps_nothing_twice():
    owner = type("Fresh", (Owner,), {})
    first, second = [], []
    wrap_once(owner, "method", _recording(first))
    wrapped = owner.method
    wrap_once(owner, "method", _recording(first))
    wrap_once(owner, "method", _recording(second))  # another wrapper for the same method: still a no-op
    assert owner.method is wrapped
    assert owner().method(2) == 30 and first == [2] and second == []
