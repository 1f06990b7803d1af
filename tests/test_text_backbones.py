"""TextClassifier on users' own Hugging Face folders (BERT, GPT-2) and dynamic padding."""

import pytest
import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertModel,
    DataCollatorWithPadding,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2Model,
)

from ripieno.datamodules import LoaderSettings, TextDataModule
from ripieno.datamodules.text import TextDataError
from ripieno.framework import TextClassifier
from ripieno.framework.cli import main
from ripieno.framework.methods.text_classifier import pool_tokens

RECIPE = "recipes/uq/ll_glm_gpt2_rotten_tomatoes.yaml"


@pytest.fixture(scope="module")
def data():
    dm = TextDataModule(max_rows=160, build_tokenizer=True, vocab_size=300, max_length=32,
                        loader=LoaderSettings(batch_size=16, eval_batch_size=40))
    dm.setup()
    return dm


def _tiny_folder(kind, path, vocab_size, pad_token_id):
    torch.manual_seed(0)
    if kind == "bert":
        model = BertModel(BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                                     pad_token_id=pad_token_id))
    else:
        model = GPT2Model(GPT2Config(vocab_size=vocab_size, n_embd=16, n_layer=1, n_head=2, n_positions=64,
                                     pad_token_id=pad_token_id))
    model.save_pretrained(path)
    return str(path)


# ------------------------------------------------------------------------ dynamic padding
def test_dynamic_padding_equals_data_collator_with_padding(data):
    tokenizer = AutoTokenizer.from_pretrained(data.spec.tokenizer_dir, local_files_only=True)
    split = data._splits["train"]
    for multiple in (None, 8):
        split.pad_to_multiple_of = multiple
        rows = [3, 0, 7, 11, 5]
        batch = split.__getitems__(rows)
        encoded = [tokenizer(split.texts[i], truncation=True, max_length=32) for i in rows]
        expected = DataCollatorWithPadding(tokenizer, padding="longest", pad_to_multiple_of=multiple,
                                           return_tensors="pt")(encoded)
        assert torch.equal(batch["input_ids"], expected["input_ids"])
        assert torch.equal(batch["attention_mask"], expected["attention_mask"])
    split.pad_to_multiple_of = None


def test_batches_are_padded_to_their_longest_text(data):
    batch = next(iter(data.train_dataloader()))
    length = batch["input_ids"].shape[1]
    assert length == int(batch["attention_mask"].sum(1).max()) <= 32
    assert bool((batch["attention_mask"][:, -1] == 1).any())  # the longest text fills the batch


def test_max_length_padding_keeps_the_old_shape(data):
    dm = TextDataModule(max_rows=160, tokenizer_dir=data.spec.tokenizer_dir, max_length=32,
                        padding="max_length", loader=LoaderSettings(batch_size=16))
    dm.setup()
    assert next(iter(dm.train_dataloader()))["input_ids"].shape == (16, 32)


@pytest.mark.parametrize(("kwargs", "message"), [({"padding": "left"}, "padding must be one of"),
                                                 ({"pad_to_multiple_of": 0}, "pad_to_multiple_of")])
def test_bad_padding_arguments(data, kwargs, message):
    with pytest.raises(TextDataError, match=message):
        TextDataModule(max_rows=160, tokenizer_dir=data.spec.tokenizer_dir, **kwargs).setup()


# ------------------------------------------------------------------------------- pooling
def test_last_pooling_finds_the_last_real_token_on_either_side():
    hidden = torch.randn(2, 5, 3)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert torch.equal(pool_tokens(hidden, right, "last"), torch.stack([hidden[0, 2], hidden[1, 4]]))
    assert torch.equal(pool_tokens(hidden, left, "last"), torch.stack([hidden[0, 4], hidden[1, 4]]))
    assert torch.allclose(pool_tokens(hidden, right, "mean")[0], hidden[0, :3].mean(0))


def test_gpt2_folder_equals_huggingface_sequence_classification(data, tmp_path):
    # Oracle: GPT2ForSequenceClassification scores the last non-padding token with a bias-free
    # linear head; ours with the same weights (bias 0) must give the same logits.
    folder = _tiny_folder("gpt2", tmp_path / "gpt2", data.spec.vocab_size, data.spec.pad_token_id)
    model = TextClassifier(data.spec, pretrained_dir=folder).eval()
    assert model.pooling == "last"
    reference = GPT2ForSequenceClassification.from_pretrained(folder, num_labels=2, local_files_only=True)
    reference.eval()
    with torch.no_grad():
        model.head.weight.copy_(reference.score.weight)
        model.head.bias.zero_()
        batch = next(iter(data.test_dataloader()))
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
        ours = model(inputs)
        expected = reference(**inputs).logits
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_bert_folder_pools_cls_and_override(data, tmp_path):
    folder = _tiny_folder("bert", tmp_path / "bert", data.spec.vocab_size, data.spec.pad_token_id)
    model = TextClassifier(data.spec, pretrained_dir=folder).eval()
    assert model.pooling == "cls" and model.head.in_features == 16
    batch = next(iter(data.test_dataloader()))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        hidden = model.backbone(**inputs).last_hidden_state
        torch.testing.assert_close(model(inputs), model.head(hidden[:, 0]))
        mean = TextClassifier(data.spec, pretrained_dir=folder, pooling="mean").eval()
        mean.head.load_state_dict(model.head.state_dict())
        m = inputs["attention_mask"][..., None].float()
        torch.testing.assert_close(mean(inputs), model.head((hidden * m).sum(1) / m.sum(1)))


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_users_folders_run_through_the_text_recipe(data, tmp_path, capsys, kind):
    folder = _tiny_folder(kind, tmp_path / kind, data.spec.vocab_size, data.spec.pad_token_id)
    main(["fit", "-c", RECIPE, "--trainer.fast_dev_run=2", f"--trainer.default_root_dir={tmp_path}",
          "--trainer.logger=false", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", "--data.init_args.max_rows=160",
          "--data.init_args.build_tokenizer=false",
          f"--data.init_args.tokenizer_dir={data.spec.tokenizer_dir}",
          f"--model.init_args.pretrained_dir={folder}"])
    out = capsys.readouterr().out
    assert "uq/test/nll" in out and "test/accuracy" in out


def test_loaded_backbone_trains_with_its_dropout(data, tmp_path):
    folder = _tiny_folder("bert", tmp_path / "bert", data.spec.vocab_size, data.spec.pad_token_id)
    model = TextClassifier(data.spec, pretrained_dir=folder)
    assert all(m.training for m in model.modules())  # from_pretrained's eval mode is undone


def test_bad_folders_name_the_fix(data, tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        TextClassifier(data.spec, pretrained_dir=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        TextClassifier(data.spec, pretrained_dir=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="Unknown pooling"):
        TextClassifier(data.spec, pooling="max")
