"""The CUDA-graph decode inputs: uploaded only when they change (on the host device here)."""

from __future__ import annotations

import numpy as np
import tvm

from ninfer_runtime.runner import _GraphInputs


def _arrays(tokens: list[int], length: int, pages: list[int], slot: int) -> list[np.ndarray]:
    table = np.zeros((2, 4), np.int32)
    table[0, : len(pages)] = pages
    positions = np.full((3, 2), length, np.int32)
    return [np.array(tokens, np.int32), positions, table, np.array([length, 0], np.int32),
            np.array([slot, 9], np.int32)]


def test_unchanged_inputs_are_not_uploaded_again_and_changed_ones_are() -> None:
    inputs = _GraphInputs(2, 4, tvm.cpu())
    first = _arrays([5, 0], 7, [3], 1)
    tensors = inputs.write(*first)
    held = list(inputs._held)
    for t, a in zip(tensors, first, strict=True):
        np.testing.assert_array_equal(t.numpy(), a)

    second = _arrays([6, 0], 8, [3], 1)  # new token, position and length; same pages and slot
    inputs.write(*second)
    for i, (t, a) in enumerate(zip(tensors, second, strict=True)):
        np.testing.assert_array_equal(t.numpy(), a)
        assert (inputs._held[i] is held[i]) == (i in (2, 4)), i  # only the table and the slots were skipped

    third = _arrays([6, 0], 8, [3, 4], 1)  # a page boundary: the table is uploaded again
    inputs.write(*third)
    np.testing.assert_array_equal(tensors[2].numpy(), third[2])
    assert inputs._held[2] is not held[2]


def test_a_caller_changing_its_array_in_place_is_still_uploaded() -> None:
    inputs = _GraphInputs(2, 4, tvm.cpu())
    arrays = _arrays([5, 0], 7, [3], 1)
    tensors = inputs.write(*arrays)
    arrays[2][0, 1] = 8  # the same array object, new contents
    inputs.write(*arrays)
    np.testing.assert_array_equal(tensors[2].numpy(), arrays[2])
