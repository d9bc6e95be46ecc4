"""refdec.prediction: OpenAI's ``prediction`` read once, for the server and the vLLM plugin: its
forms, and every bad one named in its error."""

import pytest
from pydantic import BaseModel

from refdec.prediction import describe, prediction_text


def test_prediction_text_forms():
    assert prediction_text({"type": "content", "content": "abc"}) == "abc"
    assert prediction_text({"type": "content", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}) == "ab"
    with pytest.raises(ValueError, match="prediction.type must be 'content'"):
        prediction_text({"type": "image", "content": "abc"})
    with pytest.raises(ValueError, match=r"prediction.content\[0\] must be"):
        prediction_text({"type": "content", "content": [{"type": "image_url"}]})
    with pytest.raises(ValueError, match="prediction must be an object"):
        prediction_text("abc")
    with pytest.raises(ValueError, match="prediction.content must be a string"):
        prediction_text({"type": "content", "content": 3})


def test_a_pydantic_model_is_read_as_its_dict_and_a_missing_type_means_content():
    class Body(BaseModel):
        content: str

    assert prediction_text(Body(content="x")) == "x"
    assert prediction_text({"content": "y"}) == "y"


def test_describe_names_the_type_and_cuts_long_values():
    assert describe(3) == "int 3"
    assert describe("a" * 100).startswith("str 'aaa") and describe("a" * 100).endswith("...")
