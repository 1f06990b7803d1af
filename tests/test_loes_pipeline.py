"""Layer embeddings (pooling, cache), the layer-feature datamodule, the fusion head and
GeoReg, on a tiny random BERT with MiniLM's real tokenizer (no downloads)."""

import math

import lightning as L
import pandas as pd
import pytest
import torch
from transformers import BertConfig, BertModel

from ripieno.callbacks import GeoReg
from ripieno.datamodules import TextDataModule
from ripieno.datamodules.layer_embedding_config import BackboneConfig, FeatureCacheConfig, SelectionConfig
from ripieno.datamodules.layer_embeddings import LayerEmbeddingDataModule
from ripieno.framework.backbones.loading import minilm_dir
from ripieno.framework.loes.extraction import extract_layer_embeddings
from ripieno.framework.loes.feature_cache import cached_layer_embeddings
from ripieno.framework.loes.fusion import FusionClassifier
from ripieno.framework.loes.geometry_loss import centroid_log_volume, isotropy


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_bert")
    model = BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                 intermediate_size=64))
    model.save_pretrained(path)
    return path, model.eval()


def _batches(n=2, b=5, t=7):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(1000, 2000, (b, t), generator=g)
        mask = torch.ones(b, t, dtype=torch.long)
        mask[0, 4:] = 0
        mask[2, 2:] = 0
        out.append({"input_ids": ids, "attention_mask": mask, "y": torch.randint(0, 2, (b,), generator=g)})
    return out


@pytest.mark.parametrize("pooling", ["cls", "mean", "last"])
def test_pooling_equals_manual_computation(tiny_bert, pooling):
    _, model = tiny_bert
    batches = _batches()
    keys = ["input_ids", "attention_mask"]
    emb, labels = extract_layer_embeddings(model, batches, keys, pooling, progress=False)
    assert emb.shape == (4, 10, 32) and torch.equal(labels, torch.cat([b["y"] for b in batches]))
    batch = batches[0]
    with torch.no_grad():
        states = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       output_hidden_states=True).hidden_states
    for layer, h in enumerate(states):
        for row in range(5):
            real = int(batch["attention_mask"][row].sum())
            expected = {"cls": h[row, 0], "mean": h[row, :real].mean(0), "last": h[row, real - 1]}[pooling]
            assert torch.allclose(emb[layer, row], expected, atol=1e-5)


def test_cache_is_reused_and_keyed_by_pooling_and_data(tiny_bert, tmp_path):
    _, model = tiny_bert
    keys = ["input_ids", "attention_mask"]
    first = cached_layer_embeddings(model, _batches(), keys, tmp_path, "mean", progress=False)
    second = cached_layer_embeddings(model, _batches(), keys, tmp_path, "mean", progress=False)
    assert not first[3] and second[3] and first[2] == second[2] and torch.equal(first[0], second[0])
    other_pooling = cached_layer_embeddings(model, _batches(), keys, tmp_path, "cls", progress=False)
    other_data = cached_layer_embeddings(model, _batches(n=1), keys, tmp_path, "mean", progress=False)
    assert len({first[2], other_pooling[2], other_data[2]}) == 3


def test_isotropy_and_centroid_volume_closed_forms():
    g = torch.Generator().manual_seed(0)
    iso = float(isotropy(torch.randn(20000, 8, generator=g), normalize=False))
    assert iso == pytest.approx(1.0, abs=0.01)
    rank1 = torch.randn(500, 1, generator=g) * torch.randn(1, 8, generator=g)
    assert float(isotropy(rank1, normalize=False)) == pytest.approx(1 / 8, rel=1e-4)
    z = torch.tensor([[0.0, 0.0], [0.0, 0.0], [3.0, 0.0], [3.0, 0.0], [0.0, 4.0]])
    y = torch.tensor([0, 0, 1, 1, 2])
    area = 0.5 * 3 * 4  # right triangle with legs 3 and 4
    assert float(centroid_log_volume(z, y, normalize=False, eps=0)) == pytest.approx(math.log(area), rel=1e-5)
    two = centroid_log_volume(z[:4], y[:4], normalize=False, eps=0)
    assert float(two) == pytest.approx(math.log(3.0), rel=1e-5)


def _layer_dm(tiny_bert, tmp_path, *, backbone=None, finetune_backbone=False, **selection):
    path, _ = tiny_bert
    source = TextDataModule("rotten_tomatoes", tokenizer_dir=str(minilm_dir()), max_rows=240, max_length=24)
    return LayerEmbeddingDataModule(
        source, backbone=BackboneConfig(dir=str(path), **(backbone or {})),
        selection=SelectionConfig(**({"method": "loes", "k": 2} | selection)),
        cache=FeatureCacheConfig(dir=str(tmp_path / "cache")), finetune_backbone=finetune_backbone,
        progress=False, batch_size=32)


def test_datamodule_selects_on_the_calibration_split_and_serves_the_selected_layers(tiny_bert, tmp_path):
    dm = _layer_dm(tiny_bert, tmp_path)
    spec = dm.spec
    assert spec.n_layers == 4 and spec.d_model == 32 and len(spec.selected_layers) == 2
    assert [dm.candidate_layers[i] for i in dm.selection_result.layers] == spec.selected_layers
    batch = next(iter(dm.train_dataloader()))
    assert batch["layers"].shape[1:] == (2, 32)
    # The served features are the cached pooled embeddings of the selected layers.
    raw = next(iter(dm.source.test_dataloader()))
    _, model = tiny_bert
    emb, _ = extract_layer_embeddings(model, [raw], spec.input_keys, "mean", progress=False)
    first = dm._splits["test"].layers[: len(raw["y"])]
    assert torch.allclose(first, emb[spec.selected_layers].transpose(0, 1), atol=1e-5)
    fixed = _layer_dm(tiny_bert, tmp_path, method="fixed", layers=[0, 3])
    assert fixed.spec.selected_layers == [0, 3]
    with pytest.raises(ValueError, match="out of range"):
        _ = _layer_dm(tiny_bert, tmp_path, method="fixed", layers=[7]).spec
    with pytest.raises(ValueError, match="never 'test'"):
        _layer_dm(tiny_bert, tmp_path, calibration="test")


@pytest.mark.parametrize("head", ["fusion", "scalar_mix", "linear"])
def test_fusion_heads_train(tiny_bert, tmp_path, head):
    dm = _layer_dm(tiny_bert, tmp_path, method="all" if head == "scalar_mix" else "loes")
    model = FusionClassifier(dm.spec, head=head, d_proj=16)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, default_root_dir=tmp_path / "run")
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert 0.0 <= result["test/accuracy"] <= 1.0
    # the score table of a selection goes into the run folder, once (fit and test share one run)
    assert [p.name for p in (tmp_path / "run").glob("*.csv")] == ([] if head == "scalar_mix" else
                                                                  ["selection_scores.csv"])


def test_finetuning_pools_the_same_layers_live(tiny_bert, tmp_path):
    dm = _layer_dm(tiny_bert, tmp_path, finetune_backbone=True)
    model = FusionClassifier(dm.spec, finetune_backbone=True).eval()
    raw = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        live = model.layers(raw)
    cached = _layer_dm(tiny_bert, tmp_path)._split("test").layers[: len(raw["y"])]
    assert torch.allclose(live, cached, atol=1e-5)
    with pytest.raises(ValueError, match="alike"):
        FusionClassifier(dm.spec, finetune_backbone=False)


def test_datamodule_reference_variant_and_embedding_output_candidates(tiny_bert, tmp_path):
    scores = tmp_path / "scores.csv"
    dm = _layer_dm(tiny_bert, tmp_path, variant="reference", alpha=1.0, gamma=0.5, eta=0.1,
                   calibration_rows=None, scores_path=str(scores))
    spec = dm.spec
    assert not scores.exists()  # selection keeps the table; setup writes it (absolute: no Trainer needed)
    dm.setup()
    assert dm.candidate_layers == [1, 2, 3] and 0 not in spec.selected_layers  # hidden_states[1:]
    result = dm.selection_result
    assert result.variant == "reference" and result.fused.dtype == torch.float32
    table = pd.read_csv(scores)
    assert set(table["hidden_state"]) == {1, 2, 3}
    assert table["hidden_state"].tolist() == [dm.candidate_layers[i] for i in table["layer"]]
    with_zero = _layer_dm(tiny_bert, tmp_path, backbone={"include_embedding_output": True}, method="all")
    assert with_zero.spec.selected_layers == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="ridge_loss"):
        _layer_dm(tiny_bert, tmp_path, variant="reference", ridge_loss="loo")
    with pytest.raises(ValueError, match="LOES variant"):
        _layer_dm(tiny_bert, tmp_path, variant="reference", method="greedy_ridge")


def test_georeg_raises_isotropy_and_logs_it(tiny_bert, tmp_path):
    def run(callbacks):
        torch.manual_seed(0)
        dm = _layer_dm(tiny_bert, tmp_path, method="all")
        model = FusionClassifier(dm.spec, d_proj=16, lr=3e-3)
        trainer = L.Trainer(max_epochs=4, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                            enable_model_summary=False, callbacks=callbacks, default_root_dir=tmp_path)
        trainer.fit(model, datamodule=dm)
        return trainer.callback_metrics

    georeg, probe = GeoReg(weight=1.0), GeoReg(weight=0.0)
    with_reg, without = run([georeg]), run([probe])
    assert "georeg/val/isotropy" in with_reg and "train/loss_term/georeg" in with_reg
    assert float(with_reg["georeg/val/isotropy"]) >= float(without["georeg/val/isotropy"])
    assert float(with_reg["georeg/train/isotropy"]) > float(without["georeg/train/isotropy"])


def test_georeg_term_is_float32_under_bf16_autocast():
    z = torch.randn(16, 8, dtype=torch.bfloat16, requires_grad=True)
    y = torch.tensor([0, 1] * 8)
    reg = GeoReg(weight=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = reg._term(None, {"y": y}, {"features": z})
    assert value.dtype == torch.float32
    value.backward()
    assert torch.isfinite(z.grad.float()).all()


def test_timm_vit_hidden_states_match_a_manual_block_loop(tmp_path):
    from ripieno.framework.backbones.loading import load_pretrained_backbone
    from ripieno.framework.backbones.small_models import build_small_timm_dinov2
    from ripieno.framework.loes.extraction import hidden_states

    model = load_pretrained_backbone(build_small_timm_dinov2(tmp_path / "timm")).eval()
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        states = hidden_states(model, {"pixel_values": x})
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        manual = [tokens]
        for block in model.blocks:
            tokens = block(tokens)
            manual.append(tokens)
    assert len(states) == len(model.blocks) + 1
    for state, expected in zip(states, manual, strict=True):
        assert torch.allclose(state, expected, atol=1e-5)
    batch = {"pixel_values": x, "y": torch.tensor([0, 1])}
    emb, _ = extract_layer_embeddings(model, [batch], ["pixel_values"], "cls", progress=False)
    assert torch.allclose(emb[-1], manual[-1][:, 0], atol=1e-5)
