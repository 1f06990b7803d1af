"""LOES selection time against feature-extraction time, for 7 and 25 hidden states.

What is measured
    ``--rows`` (default 2000) Rotten Tomatoes training snippets, tokenised with MiniLM's
    tokenizer (max length 64), batch 256:

    * ``extraction``: ``extract_layer_embeddings`` (mean pooling of every hidden state,
      no grad) through the real all-MiniLM-L6-v2 (6 layers + embeddings = 7 hidden
      states) and through a random BERT of the same width with 24 layers (25 hidden
      states; only its timing matters);
    * ``selection``: ``select_layers`` (LOES, K=3, LOO ridge loss and in-sample loss) on
      those same rows, the calibration set the extraction produced.

    Each selection runs ``--repeats`` times (median); extraction once (it dominates).
    All rows run in one process, side by side; the ratio is selection / extraction.

Run
    ``.venv/bin/python bench/loes_selection.py`` (about 3 minutes on 2 CPU cores);
    ``--rows 500`` for a quick look.

The last lines state whether selection stays under 1% of extraction (the issue's
target for MiniLM on the shipped text).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModel  # noqa: E402

from ripieno.datamodules import TextDataModule  # noqa: E402
from ripieno.framework.loes import extract_layer_embeddings, minilm_dir, select_layers  # noqa: E402


def main() -> None:
    """Print the timing table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TextDataModule("rotten_tomatoes", tokenizer_dir=str(minilm_dir()), max_length=64,
                          max_rows=int(args.rows / 0.72) + 10, eval_batch_size=256)
    train = data._split("train")  # the training split in a fixed order
    n = min(args.rows, len(train))
    batches = [train.__getitems__(list(range(i, min(i + 256, n)))) for i in range(0, n, 256)]
    keys = ["input_ids", "attention_mask"]
    minilm = AutoModel.from_pretrained(str(minilm_dir())).eval()
    config = AutoConfig.from_pretrained(str(minilm_dir()))
    config.num_hidden_layers = 24
    deep = AutoModel.from_config(config).eval()
    rows = []
    for name, model in (("MiniLM (7 hidden states)", minilm), ("random BERT-24 (25 hidden states)", deep)):
        start = time.perf_counter()
        emb, labels = extract_layer_embeddings(model, batches, keys, "mean", progress=False)
        extraction = time.perf_counter() - start
        layers = list(emb.unbind(0))
        for loss in ("loo", "train"):
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                result = select_layers(layers, labels, args.k, loss=loss, lam=1.0, alpha=0.1, gamma=0.05,
                                       eta=0.01)
                times.append(time.perf_counter() - start)
            selection = statistics.median(times)
            rows.append((name, loss, n, extraction, selection, result.layers))
    print(f"{n} snippets, K={args.k}, {torch.get_num_threads()} threads, selection median of {args.repeats}")
    print(f"{'model':36s} {'loss':6s} {'extract s':>10s} {'select s':>9s} {'select/extract':>15s}  layers")
    for name, loss, _, extraction, selection, layers in rows:
        share = 100 * selection / extraction
        print(f"{name:36s} {loss:6s} {extraction:10.2f} {selection:9.3f} {share:14.2f}%"
              f"  {layers}")
    worst = max(r[4] / r[3] for r in rows if r[0].startswith("MiniLM"))
    print(f"target: selection under 1% of extraction for MiniLM: {100 * worst:.2f}% -> "
          f"{'met' if worst < 0.01 else 'NOT met'}")


if __name__ == "__main__":
    main()
