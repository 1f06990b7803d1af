"""Experiments that study ripieno's ensembles: runnable modules that write CSVs and plots.

* ``python -m experiments.diversity_sweep``: member diversity and accuracy over a
  grid of adapter ranks and init scales (``rank`` x ``sigma_init``), at init and after
  training.
* ``python -m experiments.diversity_over_training``: member diversity and the
  task metric per validation epoch, for the recipe's adapter and another one.

Both build their runs from a recipe through ``RipienoCLI`` (helpers in
``experiments.runs``), so every recipe and override works the same as with
``ripieno fit``.
"""
