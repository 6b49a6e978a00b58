"""The PINN's test figure (paper 000-02): the solution ``u`` against ``u*`` and the pointwise error."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tracking.figures import new_figure


def solution_figure(x: Tensor, u: Tensor, u_star: Tensor, title: str) -> Any:
    """``u`` and ``u*`` against ``x``, and ``|u - u*|`` on a log axis."""
    order = x.argsort()
    x, u, u_star = x[order].double(), u[order].double(), u_star[order].double()
    fig, axes = new_figure(1, 2, figsize=(10, 3.5))
    axes[0].plot(x, u_star, "k-", lw=2, label="u*")
    axes[0].plot(x, u, "r--", lw=1, label="u")
    axes[0].set(xlabel="x", title=title)
    axes[0].legend()
    axes[1].semilogy(x, (u - u_star).abs().clamp_min(1e-300))
    axes[1].set(xlabel="x", ylabel="|u - u*|", title="pointwise error")
    fig.tight_layout()
    return fig
