"""LL-GLM and DNN-GLM through a (tiny, random) GPT-2 text classifier."""

import lightning as L
import pytest
import torch

from ripieno.callbacks import LaplaceGGN, LastLayerSampler, SamplerEvaluation
from ripieno.datamodules import LoaderSettings, TextDataModule
from ripieno.framework import TextClassifier


@pytest.mark.parametrize("glm", ["last_layer", "full"])
def test_glm_sampler_on_gpt2(tmp_path, glm):
    dm = TextDataModule(max_rows=160, build_tokenizer=True, vocab_size=300, max_length=16,
                        loader=LoaderSettings(batch_size=32, eval_batch_size=64))
    model = TextClassifier(dm.spec, n_layer=1, n_head=2, n_embd=16)
    callback = LastLayerSampler(glm=glm, n_samples=3, posterior=LaplaceGGN(max_iters=3),
                                evaluation=SamplerEvaluation(input_key=["input_ids", "attention_mask"]))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[callback])
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert {"uq/test/nll", "uq/test/ece", "uq/test/varroc_id"} <= set(result)
    batch = next(iter(dm.test_dataloader()))
    samples = callback.sampler.predict(batch)
    assert samples.shape == (len(batch["y"]), 3, 2)
    # Linearised predictions at z = 0 are the network's own logits.
    z = callback.sampler.z
    callback.sampler.z = torch.zeros_like(z)
    model.eval()
    with torch.no_grad():
        logits = model({k: batch[k] for k in ("input_ids", "attention_mask")})
    assert torch.allclose(callback.sampler.predict(batch)[:, 0], logits, atol=1e-5)
    callback.sampler.z = z
