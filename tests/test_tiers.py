import pytest
from pydantic import ValidationError

from harmony_mobile.models import FAMILIES, SPLIT_DEPTHS, load_tiers
from harmony_mobile.models.tiers import TierSet
from harmony_mobile.yaml_files import YamlFileError


def test_default_tiers_span_three_families_and_three_depths():
    tiers = load_tiers().tiers
    assert len(tiers) >= 4
    assert {t.family for t in tiers} == set(FAMILIES)
    assert {t.split_depth for t in tiers} == set(SPLIT_DEPTHS)
    assert any("coreml" in t.backends for t in tiers)


def write(tmp_path, text):
    path = tmp_path / "tiers.yaml"
    path.write_text(text)
    return path


GOOD = "  - {name: a, family: cnn, split_depth: 1}\n"


@pytest.mark.parametrize(
    "bad_line,field",
    [
        ("  - {name: b, family: vgg, split_depth: 1}\n", "family"),
        ("  - {name: b, family: cnn, split_depth: 4}\n", "split_depth"),
        ("  - {name: b, family: cnn, split_depth: 1, threshold: 1.5}\n", "threshold"),
        ("  - {name: b, family: cnn, split_depth: 1, input_shape: [2, 28, 28]}\n", "input_shape"),
        ("  - {name: B!, family: cnn, split_depth: 1}\n", "name"),
        ("  - {name: b, family: cnn, split_depth: 1, colour: red}\n", "colour"),
        ("  - {name: b, family: cnn, split_depth: 1, quantization: [int3]}\n", "quantization"),
    ],
)
def test_invalid_tiers_file_names_the_field(tmp_path, bad_line, field):
    path = write(tmp_path, "tiers:\n" + GOOD + bad_line)
    with pytest.raises(ValidationError) as error:
        load_tiers(path)
    assert field in str(error.value)


def test_quantization_needs_its_backend(tmp_path):
    path = write(
        tmp_path, "tiers:\n  - {name: a, family: cnn, split_depth: 1, quantization: [coreml-fp16]}\n"
    )
    with pytest.raises(ValidationError, match="needs backend 'coreml'"):
        load_tiers(path)


def test_duplicate_names_and_lookup():
    with pytest.raises(ValidationError, match="duplicate tier names: a"):
        TierSet.model_validate({"tiers": [{"name": "a", "family": "cnn", "split_depth": 1}] * 2})
    tiers = load_tiers()
    assert tiers.get("flagship").split_depth == 3
    with pytest.raises(KeyError, match="unknown tier"):
        tiers.get("nope")
    assert tiers.with_input_shape((3, 32, 32)).tiers[0].input_shape == (3, 32, 32)


def test_missing_or_broken_tiers_file(tmp_path):
    with pytest.raises(YamlFileError, match="tiers file not found"):
        load_tiers(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("tiers: [\n")
    with pytest.raises(YamlFileError, match=r"is not valid YAML: .*\(line 2, column 1\)"):
        load_tiers(broken)
