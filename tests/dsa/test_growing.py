"""GrowingTensor: appends in place into a buffer with headroom and reads as the concatenation."""

from __future__ import annotations

import pytest
import torch

from dsv32.dsa.hf import GrowingTensor


def test_appends_read_as_torch_cat_and_reuse_the_buffer_until_it_is_full():
    g = GrowingTensor(1, headroom=0.5, min_headroom=4)
    pieces = [torch.randn(2, n, 3) for n in (5, 1, 1, 1, 1, 1, 1, 3, 1)]
    held, reference, reallocations = None, None, 0
    for piece in pieces:
        before = g.buffer
        held = g.extend(held, piece)
        reference = piece if reference is None else torch.cat((reference, piece), dim=1)
        assert torch.equal(held, reference)
        reallocations += g.buffer is not before
        assert held.data_ptr() == g.buffer.data_ptr() and held.shape[1] <= g.buffer.shape[1]
    # lengths 5 (capacity 9), 6..9 fit, 10 (capacity 15), 11, 14, 15 fit: two buffers for nine appends
    assert reallocations == 2


def test_a_held_tensor_replaced_by_its_holder_is_copied_and_never_written():
    g = GrowingTensor(0, min_headroom=8)
    held = g.extend(None, torch.arange(3.0))
    replaced = held[1:].clone()  # what row selection or trimming leaves the holder
    out = g.extend(replaced, torch.tensor([9.0]))
    assert torch.equal(out, torch.tensor([1.0, 2.0, 9.0]))
    assert torch.equal(replaced, torch.tensor([1.0, 2.0]))
    assert out.data_ptr() != replaced.data_ptr()
    # a slice of the view is not the view either: it is copied, the buffer it came from is left alone
    view = g.extend(out, torch.tensor([4.0]))
    old_buffer = g.buffer
    sliced = view[:2]
    again = g.extend(sliced, torch.tensor([7.0]))
    assert torch.equal(again, torch.tensor([1.0, 2.0, 7.0]))
    assert torch.equal(old_buffer[:4], torch.tensor([1.0, 2.0, 9.0, 4.0]))


def test_cut_keeps_the_buffer_and_the_next_append_overwrites_past_the_cut():
    g = GrowingTensor(1, min_headroom=16)
    held = g.extend(None, torch.arange(10.0).view(1, 10))
    buffer = g.buffer
    held = g.cut(held, 6)
    assert held.shape == (1, 6)
    held = g.extend(held, torch.tensor([[-1.0, -2.0]]))
    assert g.buffer is buffer
    assert held.tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, -1.0, -2.0]]
    assert g.cut(held, 100).shape == (1, 8)  # a cut never lengthens


def test_empty_and_mismatched_inputs():
    g = GrowingTensor(2)
    assert torch.equal(g.extend(torch.tensor([]), torch.ones(1, 2, 3, 4)), torch.ones(1, 2, 3, 4))
    held = g.extend(None, torch.ones(1, 2, 3, 4))
    with pytest.raises(ValueError, match="other dimensions differ"):
        g.extend(held, torch.ones(2, 2, 1, 4))
    with pytest.raises(ValueError, match="non-negative"):
        GrowingTensor(-2)
    with pytest.raises(ValueError, match="headroom"):
        GrowingTensor(0, headroom=-0.1)


def test_a_view_cut_to_nothing_takes_any_shape_and_dtype_as_torch_cat_would():
    g = GrowingTensor(2)
    held = g.extend(None, torch.ones(2, 3, 5, 4))
    held = g.cut(held, 0)
    out = g.extend(held, torch.full((1, 3, 2, 4), 2.0))  # another batch: no broadcasting into the old buffer
    assert out.shape == (1, 3, 2, 4) and torch.equal(out, torch.full((1, 3, 2, 4), 2.0))
    mixed = GrowingTensor(0).extend(torch.ones(2, dtype=torch.bfloat16), torch.ones(1, dtype=torch.float32))
    assert mixed.dtype == torch.cat((torch.ones(2, dtype=torch.bfloat16), torch.ones(1))).dtype


def test_a_buffer_made_in_inference_mode_is_replaced_outside_it():
    g = GrowingTensor(0)
    with torch.inference_mode():
        held = g.extend(None, torch.arange(3.0))
    with torch.no_grad():
        out = g.extend(held, torch.tensor([3.0]))
    assert torch.equal(out, torch.arange(4.0)) and not out.is_inference()
