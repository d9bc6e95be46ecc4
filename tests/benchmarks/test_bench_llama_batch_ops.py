"""benchmarks.llama_batch_ops: the graph recorder reads llama.cpp's tensors right, and an operation is
called batch-variant only where its graph inputs agree on row 0 and its output does not."""

import numpy as np
import pytest

from benchmarks.llama_batch_ops import batch_variant_ops, decode_graphs


def node(name, values, inputs=(), op=29):
    return (name, op, None if values is None else np.asarray(values, np.float32).reshape(1, 1, -1, 4),
            [(i, f"in{i}", "f32") for i in inputs])


def test_an_op_is_listed_only_where_its_inputs_agree_and_its_output_does_not():
    same = [[1, 2, 3, 4]]
    alone = [node("x", same), node("w", None), node("y", [[1, 2, 3, 5]], [0, 1]),
             node("z", [[9, 9, 9, 9]], [2]), node("u", same, [0])]
    # batched: 3 rows; row 0 of y differs with its input x equal; z differs downstream of y
    batched = [node("x", same + [[0, 0, 0, 0]] * 2), node("w", None),
               node("y", [[1, 2, 3, 4.5]] + [[7, 7, 7, 7]] * 2, [0, 1]),
               node("z", [[9, 9, 9, 8]] + [[0, 0, 0, 0]] * 2, [2]),
               node("u", same + [[5, 5, 5, 5]] * 2, [0])]
    found = batch_variant_ops(alone, batched, context=10)
    assert list(found) == [("MUL_MAT", ("f32", "f32"))]
    assert found[("MUL_MAT", ("f32", "f32"))] == [("y", 0.5)]


def test_kq_is_compared_on_the_cells_row_0_sees():
    alone = [node("q", [[1, 1, 1, 1]]), ("kq-0", 29, np.array([1, 2, 0, 0], np.float32).reshape(1, 1, 1, 4),
                                          [(0, "q", "f32")])]
    batched = [node("q", [[1, 1, 1, 1]] * 2), ("kq-0", 29, np.array([[1, 2, 5, 0], [3, 3, 3, 3]], np.float32)
                                               .reshape(1, 1, 2, 4), [(0, "q", "f32")])]
    assert batch_variant_ops(alone, batched, context=1) == {}  # cell 2 is masked for row 0
    assert batch_variant_ops(alone, batched, context=2)[("MUL_MAT", ("f32",))] == [("kq-0", 5.0)]


@pytest.mark.llama
def test_the_recorded_graph_holds_the_logits_llama_cpp_returns(tiny_gguf):
    pytest.importorskip("llama_cpp")
    alone, batched, logits_alone, logits_batched = decode_graphs(str(tiny_gguf), 3, context=40, threads=1,
                                                                 flash_attn=False)
    assert [n[0] for n in alone] == [n[0] for n in batched]
    outputs = [n for n in alone if n[0] == "result_output"]
    assert len(outputs) == 1
    assert np.array_equal(outputs[0][2].reshape(-1), logits_alone)
    batched_output = next(n for n in batched if n[0] == "result_output")[2]
    assert batched_output.shape[-2] == 3  # the tensor layout read right: one row per token
    assert np.array_equal(batched_output[0, 0, 0], logits_batched)
