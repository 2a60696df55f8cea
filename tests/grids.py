"""Grids over every preset x model, sampled for the quick suite (tests/conftest.py)."""

from __future__ import annotations

import pytest

QUICK_STRIDE = 6
"""The quick suite keeps one pair in this many: pair (i, j) stays where (i + j) % QUICK_STRIDE == 0, so every
preset and every model keeps at least one pair (with at least QUICK_STRIDE of the other)."""


def preset_model_grid(presets: list[str], models: list[str]) -> list:
    """``(preset, model)`` params for ``pytest.mark.parametrize("preset,model_id", ...)``: all of them,
    those outside the quick sample marked ``slow``."""
    out = []
    for i, preset in enumerate(presets):
        for j, model in enumerate(models):
            marks = () if (i + j) % QUICK_STRIDE == 0 else (pytest.mark.slow,)
            out.append(pytest.param(preset, model, marks=marks, id=f"{preset}-{model}"))
    return out
