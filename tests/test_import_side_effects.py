"""Importing ripieno changes nothing in its host process.

Every module of the installed package is imported in a fresh interpreter, after the
third-party libraries it uses (so their own import-time habits are not charged to
ripieno), and the process's environment variables, RNG states, torch defaults, logging
configuration and warning filters are compared before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r'''
import importlib, json, logging, os, pkgutil, random, warnings
import numpy as np
import torch
import lightning, torchmetrics, transformers, timm, sklearn, pandas, scipy, matplotlib, tqdm
import safetensors, soundfile, jsonargparse, yaml

def snapshot():
    root = logging.getLogger()
    return {
        "env": dict(os.environ),
        "torch_rng": torch.get_rng_state().tolist(),
        "numpy_rng": np.random.get_state()[1].tolist(),
        "python_rng": repr(random.getstate()),
        "torch": [str(torch.get_default_dtype()), torch.get_num_threads(), torch.is_grad_enabled(),
                  torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(),
                  str(torch.get_default_device())],
        "logging": [root.level, [repr(h) for h in root.handlers], logging.root.manager.disable],
        "warnings": [repr(f) for f in warnings.filters],
    }

before = snapshot()
names = ["ripieno"]
for package in ("ripieno.framework", "ripieno.callbacks", "ripieno.datamodules"):
    module = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
        names.append(info.name)
after = snapshot()
changed = {key: before[key] != after[key] for key in before}
changed["env"] = sorted(k for k in set(before["env"]) | set(after["env"])
                        if before["env"].get(k) != after["env"].get(k))
print(json.dumps({"modules": names, "changed": changed}))
'''


def test_importing_every_module_changes_nothing_in_the_process():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "ripieno.framework.runner.command" in result["modules"]
    assert "ripieno.datamodules.audio" in result["modules"]
    assert len(result["modules"]) > 40
    changed = result["changed"]
    assert changed.pop("env") == []
    assert not any(changed.values()), changed
