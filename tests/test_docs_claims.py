"""What the docs say the shipped recipes use is what they use (issue 13, item 7)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TABLE_ROW = re.compile(r"^\| `lometab_\*` \| (.+) \|$", re.MULTILINE)


def _lometab_recipes() -> dict[str, dict]:
    return {path.stem.removeprefix("lometab_"): yaml.safe_load(path.read_text())["model"]["init_args"]
            for path in sorted((ROOT / "recipes" / "tabular").glob("lometab_*.yaml"))}


def test_the_lometab_row_of_the_recipe_table_matches_every_lometab_recipe() -> None:
    row = TABLE_ROW.search((ROOT / "docs" / "tabular_ensembles.md").read_text())
    assert row is not None
    stated = {name.strip(): float(value)
              for value, names in re.findall(r"([\d.]+) \(([^)]+)\)", row.group(1).split("sigma_init", 1)[1])
              for name in names.split(",")}
    recipes = _lometab_recipes()
    assert sorted(stated) == sorted(recipes), "every lometab recipe is listed, and only those"
    for name, args in recipes.items():
        assert args["sigma_init"] == stated[name], name
        assert (args["k"], args["rank"], args["adapter_init"]) == (16, 4, "plain"), name
