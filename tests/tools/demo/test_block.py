"""The demo's hand-written model: a causal transformer block over any leading shape."""

from __future__ import annotations

import torch

from gearshift.tools.demo.block import Model


def model() -> Model:
    return Model(width=16, heads=2)


def test_model_counts_tokens_and_runs_any_leading_shape() -> None:
    m = model()
    assert m(torch.ones(3, 5, 16)).shape == (3, 5, 16)
    assert m(torch.ones(7, 16)).shape == (7, 16)
    assert m.tokens == 15 + 7


def test_real_tokens_ignore_later_tokens_and_padding_but_attend_to_earlier_ones() -> None:
    m = model()
    x = torch.randn(2, 5, 16)
    padded = torch.cat([x, 100 * torch.randn(2, 3, 16)], dim=1)  # garbage, not zeros, after
    torch.testing.assert_close(m(padded)[:, :5], m(x))
    earlier = x.clone()
    earlier[:, 0] = torch.randn(2, 16)
    assert not torch.allclose(m(earlier)[:, 4], m(x)[:, 4])  # attention is not the identity
    torch.testing.assert_close(m(x)[1], m(x[1:])[0])  # rows of a batch are sequences apart
