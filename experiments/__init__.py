"""Experiments that study ripieno's methods: runnable modules that write CSVs, tables and plots.

They live in the repository, outside the installed ``ripieno`` package; run them from the
repository root as ``python -m experiments.<name>`` (``--help`` lists each one's options):

* ``diversity_sweep``: member diversity and accuracy over a grid of adapter ranks and init
  scales (``rank`` x ``sigma_init``), at init and after training;
* ``diversity_over_training``: member diversity and the task metric per validation epoch,
  for the recipe's adapter and another one;
* ``recipe_table``: several recipes trained as ``ripieno fit`` would, their test metrics
  tabulated;
* ``loes_comparison``, ``mcover_seeds``, ``uq_comparison``: LOES layer selection, M-cover
  routing and uncertainty methods against their baselines;
* ``perceptron_alpha``: the binary teacher-student perceptron annealed three ways;
* ``claims``: the side-by-side reproduction report (``docs/results/claims/claims.md``) from
  ``claims_lometab``, ``claims_uq``, ``claims_mcover`` and ``claims_loes``, each of which
  measures one seed paper's claims with its reference variant, ours and the baselines
  (``claim_rows(out, reduced=...)``, rows of ``experiments.claim_rows.ClaimRow``).

For example ``python -m experiments.diversity_sweep --recipe tabular/lometab_churn``. Runs
are built from recipes through ``RipienoCLI`` (helpers in ``experiments.runs``), with the
command line passed as its ``args``, so every recipe and override works as with
``ripieno fit``: ``--recipe`` takes a shipped recipe's name (``ripieno recipes`` lists them)
or a path to a YAML file. Default outputs go under the repository's ``docs/results``,
whatever the current folder.
"""
