"""Every (family, depth, input) pair lines up with the interface and the back-end, and exports."""

import pytest
import torch

from harmony_mobile.models import (
    FAMILIES,
    SPLIT_DEPTHS,
    Backend,
    FamilyModel,
    InterfaceSpec,
    ProjectionHead,
    parameter_names,
)
from harmony_mobile.models.heads import Connector

INPUTS = [(1, 28), (3, 32), (1, 32), (3, 28)]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("channels,size", INPUTS)
def test_front_end_connector_backend_shapes_line_up(family, channels, size):
    model = FamilyModel(family, channels, size, num_classes=10, width=0.5)
    backend = Backend(model.interface, num_classes=10)
    projection = ProjectionHead(backend.feature_dim, 32)
    images = torch.randn(3, channels, size, size)
    for depth in SPLIT_DEPTHS:
        exit_logits, features = model(images, depth)
        assert exit_logits.shape == (3, 10)
        assert features.shape == (3, *model.interface.shape)
        assert backend(features).shape == (3, 10)
        projected = projection(backend.features(features))
        assert torch.allclose(projected.norm(dim=1), torch.ones(3), atol=1e-5)
    assert model.classify_full(images).shape == (3, 10)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("depth", SPLIT_DEPTHS)
def test_front_end_exports_and_matches_eager(family, depth):
    torch.manual_seed(0)
    model = FamilyModel(family, 1, 28, num_classes=10).eval()
    front_end = model.front_end(depth).eval()
    image = torch.randn(1, 1, 28, 28)
    program = torch.export.export(front_end, (image,))
    exported_logits, exported_features = program.module()(image)
    eager_logits, eager_features = front_end(image)
    assert torch.allclose(exported_logits, eager_logits, atol=1e-5)
    assert torch.allclose(exported_features, eager_features, atol=1e-5)


def test_front_end_shares_weights_with_family_model():
    model = FamilyModel("cnn", 1, 28, num_classes=10)
    front_end = model.front_end(2)
    with torch.no_grad():
        model.connectors["2"].conv.bias.add_(1.0)
    image = torch.randn(2, 1, 28, 28)
    assert torch.equal(front_end(image)[1], model(image, 2)[1])


def test_parameter_names_are_nested_across_depths():
    model = FamilyModel("mobilenet", 1, 28, num_classes=10)
    shallow, middle, deep = (parameter_names(model, d) for d in SPLIT_DEPTHS)
    assert shallow < middle < deep
    assert not any(name.startswith("stages.3.") for name in deep)
    assert all(name.startswith(("stages.0.", "exits.1.", "connectors.1.")) for name in shallow)
    full = parameter_names(model, 0, full=True)
    assert any(name.startswith("stages.3.") for name in full)
    assert not any(name.startswith("connectors.") for name in full)


def test_configurable_interface_shape():
    interface = InterfaceSpec(channels=32, size=4)
    model = FamilyModel("resnet", 1, 28, num_classes=5, interface=interface)
    _, features = model(torch.randn(2, 1, 28, 28), 1)
    assert features.shape == (2, 32, 4, 4)
    assert Backend(interface, 5)(features).shape == (2, 5)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(family="vgg", in_channels=1, input_size=28), "unknown model family"),
        (dict(family="cnn", in_channels=2, input_size=28), "1 or 3 input channels"),
        (dict(family="cnn", in_channels=1, input_size=64), "28x28 or 32x32"),
        (dict(family="cnn", in_channels=1, input_size=28, width=0), "width multiplier"),
    ],
)
def test_bad_model_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FamilyModel(num_classes=10, **kwargs)


def test_bad_depth_and_interface_are_named():
    model = FamilyModel("cnn", 1, 28, num_classes=10)
    with pytest.raises(ValueError, match="split depth"):
        model.front_end(4)
    with pytest.raises(ValueError, match="interface size must divide"):
        Connector(16, 8, InterfaceSpec(size=16))
