"""LOES on the real vision and speech encoders, as a section of the claims report.

The same study as ``experiments.claims_loes`` (its selection rows) on EfficientNet-Lite0
(ImageNet) over MNIST 5k and the Whisper tiny.en encoder over spoken digits; see that
module's docstring. Run alone: ``python -m experiments.claims_loes --encoders``.
"""

from __future__ import annotations

from pathlib import Path

from experiments import claims_loes
from experiments.claim_rows import ClaimRow


def claim_rows(out: Path, *, reduced: bool) -> list[ClaimRow]:
    """``claims_loes.claim_rows`` with ``encoders=True`` (the report's ``loes_encoders`` section)."""
    return claims_loes.claim_rows(out, reduced=reduced, encoders=True)
