"""Models trained by edgebed workers.

Every model keeps its whole state in ``parameters()`` (no buffers such as
BatchNorm running statistics), because the parameter server only ships
parameters. Initialization uses torch's global RNG, so ``torch.manual_seed``
makes builds reproducible.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from testbed.errors import BadInput

__all__ = ["ModelError", "build_model", "check_model", "count_parameters", "initial_model", "keep_initial_model",
           "model_names"]

# (name, input shape, classes, seed) -> the model built after torch.manual_seed(seed), and torch's
# generator state the build left: kept by the netns forkserver (data/preload.py) for every fork
_INITIAL: dict[tuple, tuple[nn.Module, torch.Tensor]] = {}


class ModelError(BadInput):
    """Unknown model name or an input shape the model cannot take."""


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def model_names() -> dict[str, str]:
    """Every registered model (edgebed's and plugins') -> its one-line description."""
    from testbed import plugins

    out = {}
    for name, ep in sorted(plugins.registered("model").items()):
        try:
            out[name] = plugins.describe(ep.load())
        except Exception as e:
            out[name] = f"(does not load: {type(e).__name__}: {e})"
    return out


def model_factory(name: str):
    """The function that builds model `name` (a registered name or a plugin's module:function):
    factory(input_shape=(C, H, W), num_classes) -> nn.Module."""
    from testbed import plugins

    try:
        return plugins.load_callable("model", name, "(input_shape, num_classes) -> nn.Module")
    except plugins.PluginError as e:
        raise ModelError(str(e)) from None


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Build a freshly initialized model for ``input_shape`` = (C, H, W)."""
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ModelError(f"input_shape must be (C, H, W) with positive sizes, got {input_shape!r}")
    if num_classes < 2:
        raise ModelError(f"num_classes must be >= 2, got {num_classes}")
    model = model_factory(name)(tuple(int(s) for s in input_shape), int(num_classes))
    if not isinstance(model, nn.Module):
        raise ModelError(f"'{name}' returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def initial_model(name: str, input_shape: tuple[int, int, int], num_classes: int, seed: int) -> nn.Module:
    """The run's initial model, the same on every node: torch seeded with `seed`, then the model
    built, and torch's generator left where that build leaves it. Where a forkserver kept it
    (keep_initial_model) a fork takes a copy instead of building (13 ms less of a trainer's start
    on the AdaComp CNN)."""
    kept = _INITIAL.get((name, tuple(input_shape), num_classes, seed))
    if kept is not None:
        model, rng = kept
        torch.set_rng_state(rng)
        return copy.deepcopy(model)
    torch.manual_seed(seed)
    return build_model(name, input_shape, num_classes)


def keep_initial_model(name: str, input_shape: tuple[int, int, int], num_classes: int, seed: int) -> None:
    """Build the initial model once and keep it for initial_model (the forkserver, before it forks)."""
    torch.manual_seed(seed)
    model = build_model(name, input_shape, num_classes)
    _INITIAL[(name, tuple(input_shape), num_classes, seed)] = (model, torch.get_rng_state())


def check_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> None:
    """Build it and run two zero samples through it: ModelError unless it gives (2, num_classes)
    logits and keeps its whole state in parameters (the PS ships parameters only)."""
    model = build_model(name, input_shape, num_classes)
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        raise ModelError(f"'{name}' has buffers ({', '.join(buffers[:3])}): the PS ships parameters only "
                         "(use GroupNorm or LayerNorm, not BatchNorm)")
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, *input_shape))
    except Exception as e:
        raise ModelError(f"'{name}' fails on a batch of {'x'.join(map(str, input_shape))} samples: "
                         f"{type(e).__name__}: {e}") from None
    if tuple(getattr(out, "shape", ())) != (2, num_classes):
        raise ModelError(f"'{name}' returns shape {tuple(getattr(out, 'shape', ()))} for 2 samples of "
                         f"{'x'.join(map(str, input_shape))}, expected (2, {num_classes})")


def _downsampled(name: str, input_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    c, h, w = input_shape
    if h < 4 or w < 4:
        raise ModelError(f"model {name!r} downsamples by 4 and needs H, W >= 4, got {h}x{w}")
    return c, h, w


# edgebed's models, registered in pyproject.toml's `edgebed.models` like any plugin's.
def adacomp_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """AdaComp paper's MNIST CNN: 2x (conv3x3 32 + ReLU + maxpool2), dense 128, dense classes; 211,690 params for 1x28x28/10"""  # noqa: E501  (one line: `edgebed models` shows it)
    return AdaCompCNN(*_downsampled("adacomp_cnn", input_shape), num_classes)


def mlp(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """flatten, dense 200 + ReLU, dense 200 + ReLU, dense classes; 199,210 params for 1x28x28/10, 656,810 for 3x32x32/10"""  # noqa: E501  (one line: `edgebed models` shows it)
    c, h, w = input_shape
    return MLP(c * h * w, num_classes)


def resnet_small(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """ResNet-8: conv16 stem, 3 stages (16/32/64 ch, one basic block each), GroupNorm, global avg pool; 78,042 params for 3x32x32/10"""  # noqa: E501  (one line: `edgebed models` shows it)
    return ResNetSmall(_downsampled("resnet_small", input_shape)[0], num_classes)


def dlion_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """DLion's CNN: conv5x5 32 + pool2, conv5x5 64 + pool2, dense 1024, dense classes; 4,259,274 params for 3x32x32/10"""  # noqa: E501  (one line: `edgebed models` shows it)
    return DLionCNN(*_downsampled("dlion_cnn", input_shape), num_classes)


class AdaCompCNN(nn.Module):
    """CNN from AdaComp (Chen et al., AAAI 2018) for MNIST.

    Layout: conv3x3(C->32, same) ReLU maxpool2, conv3x3(32->32, same) ReLU maxpool2,
    dense 32*(H/4)*(W/4) -> 128 ReLU, dense 128 -> classes.
    """

    def __init__(self, c: int, h: int, w: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * (h // 4) * (w // 4), 128), nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, 200), nn.ReLU(),
            nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DLionCNN(nn.Module):
    """CNN used by DLion (Hong et al., 2021) on CIFAR-10.

    conv5x5(C->32, same) ReLU maxpool2, conv5x5(32->64, same) ReLU maxpool2,
    dense 64*(H/4)*(W/4) -> 1024 ReLU, dense 1024 -> classes. With 'same' padding a
    3x32x32 input gives 64*8*8 = 4096 features and 4,259,274 parameters.
    """

    def __init__(self, c: int, h: int, w: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), 1024), nn.ReLU(),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _gn(channels: int) -> nn.GroupNorm:
    # GroupNorm keeps no running statistics, so parameters are the whole state;
    # 8 groups divide 16/32/64 channels.
    return nn.GroupNorm(8, channels)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _gn(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = _gn(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), _gn(c_out))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetSmall(nn.Module):
    """ResNet-8 (He et al.'s CIFAR layout with one basic block per stage).

    Stride-2 stages give 32->16->8 on CIFAR and 28->14->7 on MNIST; global average
    pooling makes the classifier independent of the input size.
    """

    def __init__(self, c: int, num_classes: int, blocks_per_stage: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(c, 16, 3, padding=1, bias=False), _gn(16), nn.ReLU())
        layers: list[nn.Module] = []
        c_in = 16
        for i, c_out in enumerate((16, 32, 64)):
            for j in range(blocks_per_stage):
                layers.append(BasicBlock(c_in, c_out, stride=2 if (i > 0 and j == 0) else 1))
                c_in = c_out
        self.stages = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))
