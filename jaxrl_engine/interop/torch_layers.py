"""torch layers of the engine's own that the fast path translates: `ChannelsFirst`.

Imported only where torch is in use (the torch factories, the converter).
"""

from __future__ import annotations

import torch
from torch import nn


class ChannelsFirst(nn.Module):
    """[..., H, W, C] -> [..., C, H, W]: puts a Conv2d stack behind channels-last images."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.movedim(-1, -3)
