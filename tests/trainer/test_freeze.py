"""model.freeze: which parameters stop training, and a pattern that names none."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ftfleet.errors import ConfigError
from ftfleet.trainer.train import freeze


def model() -> nn.Module:
    return nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 4), nn.Linear(4, 2))


def test_the_parameters_a_pattern_names_stop_requiring_gradients():
    m = model()
    freeze(m, ["0.*", "1.weight"])
    assert {n for n, p in m.named_parameters() if p.requires_grad} == {"1.bias", "2.weight", "2.bias"}
    loss = m[2](m[1](m[0](torch.tensor([1, 2])))).sum()
    loss.backward()
    assert m[0].weight.grad is None and m[2].weight.grad is not None


def test_a_pattern_that_matches_nothing_is_refused_with_a_name_to_use():
    with pytest.raises(ConfigError, match=r"model.freeze: 'layers.\*' matches no parameter.*'0.weight'"):
        freeze(model(), ["layers.*"])
