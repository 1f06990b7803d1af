"""``framework.nn.cholesky.cholesky_solve`` against ``torch.cholesky_solve`` and ``torch.linalg.solve``."""

from __future__ import annotations

import pytest
import torch

from ripieno.framework.nn.cholesky import cholesky_solve


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("d", "t"), [(1, 1), (7, 3), (384, 2), (50, 80)])
def test_equals_torch_cholesky_solve_and_solves_the_system(dtype, d, t):
    generator = torch.Generator().manual_seed(d + t)
    x = torch.randn(2 * d + 3, d, generator=generator, dtype=torch.float64)
    a = (x.T @ x + torch.eye(d, dtype=torch.float64)).to(dtype)
    b = torch.randn(d, t, generator=generator, dtype=dtype)
    factor = torch.linalg.cholesky(a)
    got = cholesky_solve(b, factor)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(got, torch.cholesky_solve(b, factor), **tol)
    torch.testing.assert_close(got, torch.linalg.solve(a.double(), b.double()).to(dtype), **tol)


def test_reads_a_row_major_factor_and_leaves_both_operands_unchanged():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=generator, dtype=torch.float64)
    a = x.T @ x
    factor = torch.linalg.cholesky(a).contiguous()  # row-major, unlike LAPACK's own layout
    b = torch.randn(6, 2, generator=generator, dtype=torch.float64)
    factor_before, b_before = factor.clone(), b.clone()
    torch.testing.assert_close(a @ cholesky_solve(b, factor), b, rtol=1e-10, atol=1e-10)
    assert torch.equal(factor, factor_before) and torch.equal(b, b_before)
