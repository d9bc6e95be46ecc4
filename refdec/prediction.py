"""OpenAI's Predicted Outputs: the ``prediction`` field, read once for every front end that takes it
(``refdec serve``'s request bodies, refdec's vLLM plugin)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["describe", "prediction_text"]


def describe(value) -> str:
    """``value``'s type and a short repr, for an error message."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def prediction_text(prediction) -> str:
    """The text of a ``prediction``: ``{"type": "content", "content": str}`` or ``content`` as a
    list of ``{"type": "text", "text": str}`` parts (joined); ``type`` may be left out. A pydantic
    model is read as its dict. Raises ValueError naming what is wrong."""
    if hasattr(prediction, "model_dump"):
        prediction = prediction.model_dump()
    if not isinstance(prediction, Mapping):
        raise ValueError(f"prediction must be an object {{'type': 'content', 'content': ...}}, got {describe(prediction)}")
    if prediction.get("type", "content") != "content":
        raise ValueError(f"prediction.type must be 'content', got {prediction.get('type')!r}")
    content = prediction.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str)):
                raise ValueError(f"prediction.content[{i}] must be {{'type': 'text', 'text': str}}, got {describe(part)}")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError(f"prediction.content must be a string or a list of text parts, got {describe(content)}")
