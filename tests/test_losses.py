import ast
import inspect
import math
from pathlib import Path

import harmony_mobile.server
import pytest
import torch
import torch.nn.functional as F
from harmony_mobile.server.core.schemas import AlignmentParams

import harmony_mobile
from harmony_mobile.algorithms.harmony import Harmony
from harmony_mobile.algorithms.registry import ALGORITHMS, build_algorithm
from harmony_mobile.models.losses import (
    SUPCON_TEMPERATURE,
    cross_family_supcon,
    distillation_loss,
    supcon_loss,
)


def test_supcon_matches_a_hand_computed_batch():
    # 3 unit vectors; rows 0 and 1 share a group, row 2 has no positive (skipped as anchor)
    embeddings = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    groups = torch.tensor([4, 4, 9])
    t = 0.5
    s = embeddings @ embeddings.T / t
    # anchor 0: positive 1 among {1, 2}; anchor 1: positive 0 among {0, 2}
    l0 = -(s[0, 1] - math.log(math.exp(s[0, 1]) + math.exp(s[0, 2])))
    l1 = -(s[1, 0] - math.log(math.exp(s[1, 0]) + math.exp(s[1, 2])))
    expected = (l0 + l1) / 2
    assert torch.isclose(supcon_loss(embeddings, groups, t), torch.tensor(float(expected)), atol=1e-6)


def test_supcon_is_lower_when_positives_are_aligned():
    groups = torch.tensor([0, 0, 1, 1])
    aligned = F.normalize(torch.tensor([[1.0, 0.1], [1.0, -0.1], [0.1, 1.0], [-0.1, 1.0]]), dim=1)
    crossed = F.normalize(torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, -0.1], [-0.1, 1.0]]), dim=1)
    assert supcon_loss(aligned, groups, 0.1) < supcon_loss(crossed, groups, 0.1)


def test_supcon_without_positives_is_zero_with_a_gradient_path():
    embeddings = F.normalize(torch.randn(3, 4), dim=1).requires_grad_(True)
    loss = supcon_loss(embeddings, torch.tensor([0, 1, 2]), 0.1)
    assert loss.item() == 0.0
    loss.backward()
    assert embeddings.grad is not None


def test_distillation_is_zero_for_identical_logits_and_positive_otherwise():
    logits = torch.randn(5, 10)
    assert distillation_loss(logits, logits, 2.0).abs().item() < 1e-6
    assert distillation_loss(logits, logits.flip(1), 2.0).item() > 0.01


def test_cross_family_supcon_matches_a_hand_computed_case():
    """Anchor of family 0, group 1, client holds groups {1, 2}. Pool: same group same family (not a
    positive), same group other family (positive), group 2 (held: negative), group 3 (not held:
    ignored)."""
    anchor = F.normalize(torch.tensor([[1.0, 0.2]]), dim=1)
    pool = F.normalize(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, 0.0]]), dim=1)
    groups, families = torch.tensor([1, 1, 2, 3]), torch.tensor([0, 1, 2, 1])
    t = 0.5
    s = (anchor @ pool.T / t)[0]
    expected = -(s[1] - torch.logsumexp(torch.stack([s[1], s[2]]), dim=0))
    loss = cross_family_supcon(anchor, torch.tensor([1]), 0, torch.tensor([1, 2]), pool, groups, families, t)
    assert torch.isclose(loss, expected, atol=1e-6)
    # the unheld group's row does not matter however close it is; the same-family row neither
    moved = pool.clone()
    moved[3] = anchor[0]
    moved[0] = -anchor[0]
    assert torch.isclose(
        cross_family_supcon(anchor, torch.tensor([1]), 0, torch.tensor([1, 2]), moved, groups, families, t),
        loss,
    )


def test_cross_family_supcon_pulls_other_families_together():
    torch.manual_seed(0)
    anchors = F.normalize(torch.randn(4, 8), dim=1).requires_grad_(True)
    groups = torch.tensor([0, 0, 1, 1])
    pool = F.normalize(torch.randn(6, 8), dim=1)
    pool_groups, pool_families = torch.tensor([0, 1, 0, 1, 2, 2]), torch.tensor([1, 1, 2, 2, 1, 2])
    loss = cross_family_supcon(
        anchors, groups, 0, torch.tensor([0, 1]), pool, pool_groups, pool_families, 0.1
    )
    loss.backward()
    # a small step against the gradient moves each anchor towards its cross-family positives
    moved = F.normalize(anchors.detach() - 0.1 * anchors.grad, dim=1)
    for i in range(4):
        positives = pool[(pool_groups == groups[i])]
        assert (moved[i] @ positives.T).mean() > (anchors[i].detach() @ positives.T).mean()


def test_cross_family_supcon_without_a_cross_family_positive_is_zero_with_a_gradient_path():
    anchors = F.normalize(torch.randn(2, 4), dim=1).requires_grad_(True)
    pool = F.normalize(torch.randn(2, 4), dim=1)
    # the only rows of the anchors' group come from the anchors' own family
    loss = cross_family_supcon(
        anchors,
        torch.tensor([0, 0]),
        3,
        torch.tensor([0]),
        pool,
        torch.tensor([0, 0]),
        torch.tensor([3, 3]),
        0.1,
    )
    assert loss.item() == 0.0
    loss.backward()
    assert anchors.grad is not None


@pytest.mark.parametrize("loss", [supcon_loss, cross_family_supcon, distillation_loss])
def test_a_loss_takes_its_temperature_from_its_caller(loss):
    """A default here would be a second copy of the configs' default, free to drift from it."""
    assert inspect.signature(loss).parameters["temperature"].default is inspect.Parameter.empty


def test_every_config_that_resolves_the_supcon_temperature_agrees_on_its_default():
    """The training server (through each method's server config) and the fallback server's alignment
    round start from the one SUPCON_TEMPERATURE; a method's config can change it, its default cannot."""
    assert AlignmentParams().temperature == SUPCON_TEMPERATURE
    terms = {}
    on = {"contrastive_weight": 0.5}  # SupCon is off by default
    for name, (method, _) in ALGORITHMS.items():
        split_trainer_config = build_algorithm(name, on if method is Harmony else None).split_trainer_config()
        if split_trainer_config is not None and split_trainer_config.contrastive is not None:
            terms[name] = split_trainer_config.contrastive.temperature
    assert {"harmony", "harmony-with-contrastive", "harmony-with-meta", "harmony-full-softmax"} <= set(terms)
    assert set(terms.values()) == {SUPCON_TEMPERATURE}
    assert build_algorithm("harmony").split_trainer_config().contrastive is None
    turned_on = build_algorithm("harmony-with-contrastive", {"temperature": 0.2})
    assert turned_on.split_trainer_config().contrastive.temperature == 0.2


def _literal_temperature_defaults(path: Path) -> list[str]:
    """`*temperature` parameters or fields given a number literal as default in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.arguments):
            positional = [*node.posonlyargs, *node.args]
            with_default = positional[len(positional) - len(node.defaults) :]
            pairs = [*zip(with_default, node.defaults, strict=True)]
            pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True) if d is not None]
            found += [f"{path.name}:{a.lineno} {a.arg}" for a, d in pairs if a.arg.endswith("temperature")]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if not node.target.id.endswith("temperature"):
                continue
            value = node.value
            if isinstance(value, ast.Call):
                value = next((k.value for k in value.keywords if k.arg == "default"), None)
            if isinstance(value, ast.Constant):
                found.append(f"{path.name}:{node.lineno} {node.target.id}")
    return found


def test_no_temperature_default_is_written_twice():
    """Every temperature default in the package and the server names the constant in losses.py."""
    roots = [Path(harmony_mobile.__file__).parent, Path(harmony_mobile.server.__file__).parent]
    found = [
        hit for root in roots for path in root.rglob("*.py") for hit in _literal_temperature_defaults(path)
    ]
    assert found == []
