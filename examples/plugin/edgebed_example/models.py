"""A tiny CNN: an edgebed model is a function (input_shape, num_classes) -> torch.nn.Module
whose whole state is in its parameters (the PS ships parameters only: no BatchNorm)."""

from __future__ import annotations

from torch import nn


def tiny_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """conv3x3 8 + ReLU + global average pool, dense classes; 80 + 9 x classes parameters for 1 channel"""
    c, _, _ = input_shape
    return nn.Sequential(nn.Conv2d(c, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, num_classes))
