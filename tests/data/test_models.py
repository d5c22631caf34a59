"""Tests for testbed.data.models."""

from __future__ import annotations

import pytest
import torch

from testbed import plugins
from testbed.data.models import ModelError, build_model, count_parameters, model_names

BUILTIN = sorted(n for n, ep in plugins.registered("model").items() if ep.value.startswith("testbed."))

SHAPES = [(1, 28, 28), (3, 32, 32), (1, 8, 8)]


@pytest.mark.parametrize("name, shape, classes, want", [
    ("adacomp_cnn", (1, 28, 28), 10, 211_690),  # AdaComp paper's MNIST CNN
    ("dlion_cnn", (3, 32, 32), 10, 4_259_274),  # DLion's CIFAR-10 CNN
    ("mlp", (1, 28, 28), 10, 199_210),
    ("mlp", (3, 32, 32), 10, 656_810),
    ("resnet_small", (3, 32, 32), 10, 78_042),
    ("resnet_small", (1, 28, 28), 10, 77_754),  # only the stem's input channels differ
    ("adacomp_cnn", (3, 32, 32), 10, 273_706),  # dense layer grows to 32*8*8 -> 128
])
def test_exact_parameter_counts(name: str, shape: tuple[int, int, int], classes: int, want: int) -> None:
    assert count_parameters(build_model(name, shape, classes)) == want


def test_descriptions_quote_the_counts() -> None:
    assert "211,690" in model_names()["adacomp_cnn"]
    assert "4,259,274" in model_names()["dlion_cnn"]
    assert "199,210" in model_names()["mlp"]
    assert "78,042" in model_names()["resnet_small"]
    assert all("\n" not in d for d in model_names().values())


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("classes", [10, 7])
def test_forward_backward(name: str, shape: tuple[int, int, int], classes: int) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, classes)
    x = torch.randn(4, *shape)
    y = torch.randint(0, classes, (4,))
    out = model(x)
    assert out.shape == (4, classes)
    loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, pname
        assert torch.isfinite(p.grad).all(), pname
    assert any(float(p.grad.abs().sum()) > 0 for p in model.parameters())


@pytest.mark.parametrize("name", BUILTIN)
def test_state_is_only_parameters(name: str) -> None:
    # The parameter server ships parameters only: no buffers (e.g. BatchNorm stats).
    model = build_model(name, (3, 32, 32), 10)
    assert list(model.buffers()) == []
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters()}


@pytest.mark.parametrize("name", BUILTIN)
def test_deterministic_given_seed(name: str) -> None:
    def params(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return [p.detach().clone() for p in build_model(name, (1, 28, 28), 10).parameters()]

    a, b, c = params(5), params(5), params(6)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("name", BUILTIN)
def test_learns_a_fixed_batch(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, (1, 28, 28), 10)
    x, y = torch.randn(16, 1, 28, 28), torch.arange(16) % 10
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = None
    for _ in range(15):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first


def test_errors() -> None:
    with pytest.raises(ModelError, match=r"unknown model 'vgg' \(known: adacomp_cnn, dlion_cnn"):
        build_model("vgg", (1, 28, 28), 10)
    with pytest.raises(ModelError, match="needs H, W >= 4"):
        build_model("adacomp_cnn", (1, 3, 3), 10)
    with pytest.raises(ModelError, match="input_shape"):
        build_model("mlp", (28, 28), 10)  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="num_classes"):
        build_model("mlp", (1, 28, 28), 1)


def test_a_kept_initial_model_is_a_copy_of_the_seeded_build_and_leaves_torch_where_the_build_did(monkeypatch) -> None:
    """What the netns forkserver keeps (data/preload.py) hands each node the model and the torch
    generator state a build after torch.manual_seed(seed) gives: a node's run does not change with it."""
    import importlib

    from testbed.data import models, preload as dataset_preload

    monkeypatch.setattr(models, "_INITIAL", {})
    built = models.initial_model("adacomp_cnn", (1, 28, 28), 10, 7)
    after_build = torch.rand(3)
    assert not models._INITIAL  # nothing kept: built here
    monkeypatch.setenv(dataset_preload.ENV, "")  # unset again after the test (request() sets it)
    dataset_preload.request("mnist5k", 7, None, "adacomp_cnn")
    importlib.reload(dataset_preload)  # what the forkserver does on import
    assert list(models._INITIAL) == [("adacomp_cnn", (1, 28, 28), 10, 7)]
    torch.manual_seed(999)  # a node's own seeding before it asks
    a = models.initial_model("adacomp_cnn", (1, 28, 28), 10, 7)
    assert torch.equal(torch.rand(3), after_build)
    b = models.initial_model("adacomp_cnn", (1, 28, 28), 10, 7)
    for pa, pb, pc in zip(a.parameters(), b.parameters(), built.parameters()):
        assert torch.equal(pa, pc) and torch.equal(pb, pc)
    with torch.no_grad():
        next(a.parameters()).add_(1.0)  # a trainer's steps change its copy only
    assert torch.equal(next(b.parameters()), next(built.parameters()))
    # another seed, or a model that is not edgebed's own, is built in the node as before
    other = models.initial_model("adacomp_cnn", (1, 28, 28), 10, 8)
    assert not torch.equal(next(other.parameters()), next(built.parameters()))
    models._INITIAL.clear()
    dataset_preload.request("mnist5k", 7, None, "some.module:factory")
    importlib.reload(dataset_preload)
    assert not models._INITIAL
