"""``ripieno tune``: Optuna studies over recipes (search spaces, workers, storage, results).

Needs the ``tune`` extra (``pip install 'ripieno[tune]'``: optuna and optuna-integration).
"""
