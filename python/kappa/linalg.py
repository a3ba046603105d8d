"""Spectral linear algebra on torch tensors: ``msign`` with every schedule kappa has, the
Polar Express coefficient generator, and condition numbers."""

import json
from typing import Union

import torch

from . import _kappa

Method = Union[str, dict]


def _method(method: Method) -> str:
    return method if isinstance(method, str) else json.dumps(method)


def msign(x: torch.Tensor, method: Method = "polar_express", precision: str = "auto") -> torch.Tensor:
    """The orthogonal polar factor U·Vᵀ of ``x`` (a matrix, or a stack whose leading
    dimensions are batch), computed by ``method``.

    ``method`` is a preset name (``"exact"`` (SVD), ``"muon_quintic"``, ``"muon_reference"``,
    ``"torch_muon"``, ``"polar_express"``, ``"modded_nanogpt"``, ``"gram_polar_express"``,
    ``"aol"``, ``"gram_aol"``, ``"aol_three_steps"``, ``"gram_aol_three_steps"``) or a dict in
    the form of kappa-optim's ``Msign`` (``{"polar_express": {"steps": 8}}``,
    ``{"polar_express_designed": {"lower": 1e-3, "steps": 5, "safety": 1.02}}``).
    ``precision`` is ``"auto"``, ``"native"``, ``"f32"`` or ``"bf16"``. Raises ``ValueError``
    for a bad shape, a non-finite entry or an unknown method.
    """
    return _kappa.msign(x, _method(method), precision)


def msign_config(method: str) -> dict:
    """The dict form of an msign preset (to edit into a variant of your own)."""
    return json.loads(_kappa.msign_config(method))


def polar_express_coefficients(
    lower: float,
    steps: int,
    safety: float = 1.0,
    cushion: float = 0.02407327424182761,
    rule: str = "in_design",
    degree: int = 5,
) -> list:
    """The Polar Express schedule for singular values in ``[lower, 1]``: one ``(a, b, c)`` per
    step, p(x) = a·x + b·x³ + c·x⁵.

    ``rule="in_design"`` is the public generator's rule (the safety factor enters each step's
    interval; the last step is unscaled), ``"after_design"`` scales every step before the
    converged tail instead. modded-nanogpt's table is
    ``polar_express_coefficients(1e-3, 5, safety=1.02, cushion=0.02)``.
    """
    return _kappa.polar_express_coefficients(lower, steps, safety, cushion, rule, degree)


def condition_number(a: torch.Tensor) -> float:
    """κ(A) = σ₁/σ_min(m,n) from the SVD, in f64 (``inf`` below full numerical rank)."""
    return _kappa.condition_number(a)


def condition_number_estimate(
    a: torch.Tensor, tol: float = 1e-3, max_iter: int = 300, seed: int = 0
) -> dict:
    """κ(A) without an SVD: power iteration for σ_max and inverse iteration for σ_min.

    Returns a dict with ``kappa``, ``sigma_max``, ``sigma_min``, ``iterations``,
    ``converged``, ``residual`` and ``error_estimate``.
    """
    return _kappa.condition_number_estimate(a, tol, max_iter, seed)
