"""Specifies refdec.transformers.transfer: a step's host array reaches its device as a tensor of the same
dtype, shape and values; on the CPU without a copy (the tensor shares the array's memory)."""

from __future__ import annotations

import numpy as np
import torch

from refdec.transformers.transfer import to_device


def test_on_the_cpu_the_tensor_shares_the_arrays_memory():
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    tensor = to_device(array, "cpu")
    assert tensor.dtype == torch.int32 and tuple(tensor.shape) == (3, 4)
    array[0, 0] = 99
    assert int(tensor[0, 0]) == 99  # no copy


def test_a_strided_array_arrives_contiguous_with_its_values():
    array = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]
    tensor = to_device(array, torch.device("cpu"))
    assert tensor.is_contiguous() and tensor.tolist() == array.tolist()


def test_another_device_gets_a_copy_of_the_same_dtype_and_shape():
    tensor = to_device(np.zeros((2, 3), dtype=np.float32), "meta")  # a device without data: the plain copy path
    assert tensor.device.type == "meta" and tensor.dtype == torch.float32 and tuple(tensor.shape) == (2, 3)
