"""kappa.linalg against torch.linalg and the published Polar Express table."""
import pytest
import torch

import kappa
from kappa import linalg


def matrix(m, n, kappa_target, seed):
    """An m×n f64 matrix with singular values geometric from 1 to 1/kappa_target."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, n, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    s = torch.logspace(0, -torch.log10(torch.tensor(kappa_target)).item(), n, dtype=torch.float64)
    return u @ torch.diag(s) @ v.T, u, v


def test_exact_msign_is_the_svds_polar_factor():
    x, u, v = matrix(40, 24, 100.0, 0)
    assert (linalg.msign(x, "exact") - u @ v.T).abs().max().item() <= 1e-12


@pytest.mark.parametrize("method", ["polar_express", "gram_polar_express", "muon_quintic"])
def test_polynomial_msign_keeps_the_singular_vectors_and_moves_the_values_towards_one(method):
    x, u, v = matrix(48, 32, 50.0, 1)
    o = linalg.msign(x, method, precision="native")
    # An odd polynomial in X: diagonal in X's singular basis up to f64 roundoff.
    core = u.T @ o @ v
    off = core - torch.diag(torch.diagonal(core))
    assert off.abs().max().item() <= 1e-10
    # Muon's quintic converges to its band around 1 (about [0.7, 1.2]); Polar Express to 1.
    low, high = (0.6, 1.25) if method == "muon_quintic" else (0.98, 1.02)
    d = torch.diagonal(core)
    assert d.min().item() >= low and d.max().item() <= high


def test_aol_msign_is_orthogonal_to_its_design_accuracy():
    # AOL rescales the columns before its polynomial steps, so the singular vectors move; its
    # singular values land in the band of its 4-step Turbo-Muon schedule, like Muon's quintic's.
    x, _, _ = matrix(48, 32, 50.0, 1)
    s = torch.linalg.svdvals(linalg.msign(x, "aol", precision="native"))
    assert s.min().item() >= 0.6 and s.max().item() <= 1.25


def test_msign_of_a_stack_is_msign_of_each_matrix():
    x = torch.randn(3, 16, 8, dtype=torch.float64)
    stacked = linalg.msign(x, "polar_express", precision="native")
    for i in range(3):
        assert torch.equal(stacked[i], linalg.msign(x[i], "polar_express", precision="native"))


def test_the_generator_reproduces_modded_nanogpts_table():
    # modded-nanogpt's polar_express_coeffs (5 steps, ℓ = 1e-3, safety 1.02, cushion 0.02),
    # as published.
    published = [
        (8.156554524902461, -22.48329292557795, 15.878769915207462),
        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
    ]
    ours = linalg.polar_express_coefficients(1e-3, 5, safety=1.02, cushion=0.02)
    for a, b in zip(ours, published):
        assert a == pytest.approx(b, rel=1e-12)


def test_condition_numbers_match_torch():
    x, _, _ = matrix(30, 10, 1e3, 2)
    assert linalg.condition_number(x) == pytest.approx(torch.linalg.cond(x).item(), rel=1e-10)
    e = linalg.condition_number_estimate(x, tol=1e-6)
    assert e["converged"] and e["kappa"] == pytest.approx(1e3, rel=1e-4)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="matrix"):
        linalg.msign(torch.ones(4))
    with pytest.raises(ValueError, match="non-finite"):
        linalg.msign(torch.tensor([[1.0, float("inf")], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="unknown msign"):
        linalg.msign(torch.eye(3), "newton")
    with pytest.raises(ValueError, match="steps"):
        linalg.msign(torch.eye(3), {"polar_express": {"steps": "ten"}})
    with pytest.raises(TypeError):
        linalg.condition_number([[1.0, 0.0], [0.0, 1.0]])
    for empty in (torch.ones(2, 0, 4), torch.ones(0, 4, 4), torch.ones(0, 3)):
        with pytest.raises(ValueError, match="empty"):
            linalg.msign(empty)
    with pytest.raises(ValueError, match="unknown precision `half`"):
        linalg.msign(torch.eye(3), precision="half")
