"""``gram_matrix`` against ``x.T @ x`` (oracle: the full GEMM in float64)."""

from __future__ import annotations

import pytest
import torch

from ripieno.framework.nn.gram import GRAM_BLOCK, gram_matrix


@pytest.mark.parametrize("width", [1, 95, GRAM_BLOCK * 2 - 40, 384, 601])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gram_matrix_equals_the_full_product_and_is_symmetric(width: int, dtype: torch.dtype) -> None:
    x = torch.randn(257, width, generator=torch.Generator().manual_seed(width), dtype=torch.float64)
    gram = gram_matrix(x.to(dtype))
    expected = x.T @ x
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(gram.double(), expected, rtol=tol, atol=tol * float(expected.abs().max()))
    assert torch.equal(gram, gram.T) and gram.dtype == dtype


def test_gram_matrix_of_a_strided_view() -> None:
    x = torch.randn(300, 200, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    view = x[:, ::2]  # non-contiguous columns
    torch.testing.assert_close(gram_matrix(view), view.T @ view, rtol=1e-12, atol=1e-9)
