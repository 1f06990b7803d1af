"""One DataSpec base: every spec round-trips through YAML and weights_only checkpoints (issue 21 item 2)."""

from __future__ import annotations

import io

import pytest
import torch
import yaml
from helpers.tables import make_table

from ripieno.datamodules.vision_backbone import BackboneDataSpec as ReExportedBackboneSpec
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.mcover.perceptron import TeacherStudentSpec as ReExportedTeacherSpec
from ripieno.framework.specs import (
    BackboneDataSpec,
    DataSpec,
    ImageSpec,
    LayerFeatureSpec,
    TabularSpec,
    TeacherStudentSpec,
    TextSpec,
)
from ripieno.framework.specs.base import DIGEST_KEY, DataSpecError
from ripieno.framework.specs.tabular_preprocessing import TabularPreprocessor


def _tabular() -> TabularSpec:
    frame = make_table(n=60, task="multiclass")
    pre = TabularPreprocessor(["x1", "x2", "count"], ["colour"]).fit(frame)
    return TabularSpec("multiclass", 3, cat_cardinalities=pre.cat_cardinalities, n_classes=3,
                       bins=[[-1.0, 0.0, 1.0], [-1.0, 1.0], [0.0, 0.5, 1.0, 2.0]],
                       num_feature_names=pre.num_feature_names, cat_feature_names=pre.cat_feature_names,
                       class_names=["a", "b", "c"], target_name="y", preprocessing=pre.state_dict())


SPECS = {
    "tabular": _tabular,
    "text": lambda: TextSpec(2, ["neg", "pos"], max_length=16, vocab_size=50, pad_token_id=0,
                             tokenizer_dir="tok", n_train=8, n_val=2, n_test=2, dataset="reviews"),
    "image": lambda: ImageSpec(2, (1, 8, 8), ["cat", "dog"], 8, 2, 2, "pets", ood_dataset="noise", n_ood=3,
                               mean=[0.5], std=[0.25]),
    "layer_features": lambda: LayerFeatureSpec(2, ["a", "b"], n_layers=4, d_model=8, selected_layers=[3, 1],
                                               selection="loes", pooling="mean", backbone_dir="model",
                                               input_keys=["pixel_values"], layer_dims=[8, 4]),
    "backbone": lambda: BackboneDataSpec(2, ["a", "b"], 8, 2, 2, "clips", input_keys=["input_values"],
                                         modality="audio", sampling_rate=16000),
    "teacher_student": lambda: TeacherStudentSpec(4, 8, 2, 2, "binary", 0.1, teacher=[1, -1, -1, 1]),
}


def _is_plain(value: object) -> bool:
    """Only dicts with str keys, lists, str, int, float, bool and None (no tuples, no objects)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


@pytest.fixture(params=sorted(SPECS))
def spec(request: pytest.FixtureRequest) -> DataSpec:
    return SPECS[request.param]()


def test_every_spec_derives_from_the_base_and_keeps_its_public_paths():
    assert all(isinstance(make(), DataSpec) for make in SPECS.values())
    assert ReExportedBackboneSpec is BackboneDataSpec and ReExportedTeacherSpec is TeacherStudentSpec


def test_to_dict_is_plain_python_and_round_trips_through_yaml(spec):
    assert _is_plain(spec.to_dict()) and _is_plain(spec.hparams_dict())
    text = yaml.safe_dump(spec.to_dict())  # SafeDumper refuses objects
    assert type(spec).coerce(yaml.safe_load(text)) == spec
    assert type(spec).coerce(spec) is spec


def test_to_dict_round_trips_through_a_weights_only_checkpoint(spec):
    buffer = io.BytesIO()
    torch.save({"data_spec": spec.to_dict(), "compact": spec.hparams_dict()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert type(spec).coerce(loaded["data_spec"]) == spec
    restored = type(spec).coerce(loaded["compact"]).with_fitted_state(spec.fitted_state())
    assert restored == spec


def test_coerce_names_the_class_and_what_to_pass(spec):
    name = type(spec).__name__
    with pytest.raises(TypeError) as error:
        type(spec).coerce(42)
    assert str(error.value) == (f"data_spec must be a {name} or dict, got int; pass datamodule.spec (the"
                                " ripieno CLI links it for you).")


def test_only_the_tabular_spec_has_fitted_state_and_it_leaves_the_hparams():
    full = _tabular()
    for name, make in SPECS.items():
        if name != "tabular":
            assert make().hparams_dict() == make().to_dict() and make().fitted_state() == {}
    compact = full.hparams_dict()
    assert "preprocessing" not in compact and "bins" not in compact
    assert compact["bin_counts"] == [2, 1, 3] and compact["class_names"] == ["a", "b", "c"]
    assert set(full.fitted_state()) == {"preprocessing", "bins"}  # three short class names stay
    assert len(yaml.safe_dump(compact)) < len(yaml.safe_dump(full.to_dict())) / 5


def test_the_digest_tells_specs_fitted_on_other_rows_apart():
    spec = _tabular()
    other = spec.with_fitted_state({"bins": [[-1.0, 0.0, 1.5], [-1.0, 1.0], [0.0, 0.5, 1.0, 2.0]]})
    assert spec.hparams_dict()[DIGEST_KEY] != other.hparams_dict()[DIGEST_KEY]
    assert spec.hparams_dict()[DIGEST_KEY] == _tabular().hparams_dict()[DIGEST_KEY]
    assert {k: v for k, v in spec.hparams_dict().items() if k != DIGEST_KEY} == \
        {k: v for k, v in other.hparams_dict().items() if k != DIGEST_KEY}


def test_long_class_names_are_fitted_state():
    names = [f"a rather long class name number {i}" for i in range(40)]
    spec = TabularSpec("multiclass", 1, n_classes=40, class_names=names)
    assert "class_names" not in spec.hparams_dict() and spec.fitted_state() == {"class_names": names}
    assert TabularSpec.coerce(spec.hparams_dict()).with_fitted_state(spec.fitted_state()) == spec


def test_a_compact_tabular_spec_sizes_the_embeddings_with_placeholder_edges():
    compact = TabularSpec.coerce(_tabular().hparams_dict())
    assert compact.bins is None and compact.preprocessing is None
    assert [len(edges) - 1 for edges in compact.bin_tensors()] == [2, 1, 3]
    with pytest.raises(ValueError, match="bin_counts"):
        TabularSpec("regression", 2, bins=[[0.0, 1.0], [0.0, 1.0]], bin_counts=[1, 2])


def test_fitted_state_of_another_class_is_refused():
    with pytest.raises(DataSpecError, match="has no fitted field"):
        SPECS["text"]().with_fitted_state({"bins": [[0.0, 1.0]]})


def test_backbone_spec_errors_are_input_errors_with_their_message():
    with pytest.raises(RipienoInputError, match=r"input_keys must name the model inputs \(not 'y'\)"):
        BackboneDataSpec(2, ["a", "b"], 8, 2, 2, "d", input_keys=["y"])
