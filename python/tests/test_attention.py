"""kappa.attention against torch.func and the theorems' own statements."""
import pytest
import torch

import kappa
from kappa import attention as ka


def head(n=6, d=5, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    ws = [0.5 * torch.randn(d, k, generator=g, dtype=torch.float64) for _ in range(3)]
    return x, ws


def torch_head(x, wq, wk, wv, divisor=1.0, causal=False):
    s = x @ wq @ (x @ wk).T / divisor
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ (x @ wv)


def jacrev_columns(x, ws, **kw):
    """torch.func.jacrev of the head, laid out as kappa's column-major J."""
    n, k = x.shape[0], ws[0].shape[1]
    blocks = []
    for i in range(3):
        def f(w):
            args = list(ws)
            args[i] = w
            return torch_head(x, *args, **kw)
        jac = torch.func.jacrev(f)(ws[i])  # [N, k, D, k]: ∂A[a, c]/∂W[d, e]
        # Row a + c·N, column d + e·D: transpose both index pairs to column-major order.
        blocks.append(jac.permute(1, 0, 3, 2).reshape(n * k, -1))
    return torch.cat(blocks, dim=1)


@pytest.mark.parametrize("causal", [False, True])
def test_the_weight_jacobian_equals_torch_func_jacrev(causal):
    x, ws = head()
    ours = ka.weight_jacobian(x, *ws, causal=causal)
    theirs = jacrev_columns(x, ws, causal=causal)
    assert ours.shape == theirs.shape == (6 * 3, 3 * 5 * 3)
    # Both are f64 evaluations of one closed form; entries are O(1), so the difference is a
    # few ulps times the O(N·D) terms of each entry.
    assert (ours - theirs).abs().max().item() <= 1e-12


def test_the_matrix_free_products_are_j_and_j_transpose():
    x, ws = head(seed=1)
    j = ka.weight_jacobian(x, *ws, scale="inv_sqrt_k")
    g = torch.Generator().manual_seed(2)
    t = [torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(3)]
    jvp = ka.jvp_weights(x, *ws, *t, scale="inv_sqrt_k")
    dense = j @ torch.cat([ti.T.reshape(-1) for ti in t])  # column-major vec of each tangent
    assert (jvp.T.reshape(-1) - dense).abs().max().item() <= 1e-12
    cot = torch.randn(6, 3, generator=g, dtype=torch.float64)
    vjp = ka.vjp_weights(x, *ws, cot, scale="inv_sqrt_k")
    dense = j.T @ cot.T.reshape(-1)
    assert (torch.cat([v.T.reshape(-1) for v in vjp]) - dense).abs().max().item() <= 1e-12


def test_theorem_3_4_bounds_the_jacobians_condition_number():
    x, ws = head(n=4, d=6, k=2, seed=3)
    t = ka.theorem_3_4(x, *ws)
    s = torch.linalg.svdvals(ka.weight_jacobian(x, *ws))
    assert t["jacobian"]["full"]["sigma_max"] == pytest.approx(s[0].item(), rel=1e-10)
    assert t["holds"] and t["jacobian"]["full"]["kappa"] <= t["rhs"]


def test_the_svd_correction_brings_kappa_below_two():
    w = torch.randn(16, 4, dtype=torch.float64) @ torch.diag(torch.tensor([1.0, 1e-1, 1e-2, 1e-3], dtype=torch.float64))
    c = ka.svd_correction(w)
    s = torch.linalg.svdvals(w)
    corrected = torch.linalg.svdvals(w + c)
    assert (corrected[0] / corrected[-1]).item() == pytest.approx((2 * s[0] / (s[0] + s[-1])).item(), rel=1e-10)
    e = ka.identity_shift(5, 2, 0.5, offset=3)
    assert torch.equal(e, 0.5 * torch.eye(5, dtype=torch.float64)[:, 3:5])


def test_diagnostics_of_a_uniform_and_a_saturated_head():
    n = 8
    uniform = ka.diagnostics(torch.full((n, n), 1.0 / n), torch.zeros(n, n))
    assert uniform["mean_entropy"] == pytest.approx(uniform["uniform_entropy"], rel=1e-12)
    assert uniform["saturated_fraction"] == 0.0
    scores = 50.0 * torch.eye(n, dtype=torch.float64)
    sat = ka.diagnostics(torch.softmax(scores, dim=-1), scores)
    assert sat["saturated_fraction"] == 1.0 and sat["max_logit"] == 50.0


def test_the_conditioned_module_is_attention_with_corrected_weights():
    torch.manual_seed(0)
    m = ka.ConditionedMultiheadAttention(8, 2, correction="identity", lam=0.5, causal=True)
    x = torch.randn(3, 5, 8)
    y = m(x)
    # Head h by hand from its effective weights, then the output projection.
    heads = [torch.stack([torch_head(xb, *m.head_weights(h), divisor=2.0, causal=True) for xb in x]) for h in range(2)]
    expected = m.out(torch.cat(heads, dim=-1))
    assert torch.allclose(y, expected, atol=1e-5)
    # The identity correction of the whole projection is λ·I (H·k = D).
    assert torch.equal(m.c_q, 0.5 * torch.eye(8))
    y.sum().backward()
    assert m.q.weight.grad is not None and m.c_q.grad is None


def test_the_hook_reports_each_head():
    torch.manual_seed(1)
    model = torch.nn.Sequential(ka.ConditionedMultiheadAttention(8, 2, correction="svd"))
    hook = ka.DiagnosticsHook(model, every=2, max_tokens=4)
    for _ in range(3):
        model(torch.randn(2, 6, 8))
    report = hook.report()
    hook.remove()
    assert list(report) == ["0"] and len(report["0"]) == 2
    for row in report["0"]:
        # κ ≥ 1 for any matrix; finite because these random heads' Jacobians have full rank.
        assert 1.0 <= row["kappa_j"] < float("inf") and 0.0 <= row["saturated_fraction"] <= 1.0


def test_bad_inputs_raise_value_errors_with_kappas_message():
    x, ws = head()
    with pytest.raises(ValueError, match="wk"):
        ka.weight_jacobian(x, ws[0], torch.zeros(4, 3, dtype=torch.float64), ws[2])
    with pytest.raises(ValueError, match="non-finite|NaN"):
        ka.weight_jacobian(x * float("nan"), *ws)
    with pytest.raises(ValueError, match="score scale"):
        ka.weight_jacobian(x, *ws, scale="sqrt")
    with pytest.raises(ValueError):
        ka.ConditionedMultiheadAttention(10, 3)


@pytest.mark.parametrize("optimizer", ["muon_adamw", "modulewise"])
def test_the_nanogpt_example_trains_and_its_loss_falls(optimizer):
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    text = pathlib.Path(os.environ.get("KAPPA_DATA", root / "data")) / "sotu" / "train.txt"
    if not text.is_file():
        pytest.skip("the sotu data set is not installed (cargo xtask setup --data sotu)")
    run = subprocess.run(
        [sys.executable, str(root / "python" / "examples" / "nanogpt.py"), "--text", str(text), "--steps", "60",
         "--report-every", "30", "--chars", "200000", "--correction", "identity", "--lam", "0.5",
         "--optimizer", optimizer],
        capture_output=True, text=True, timeout=600, check=True,
    )
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    # Below the entropy of the text's character frequencies: a model that only learned them
    # would stop there, so the loss falls because attention learned context.
    chars = text.read_text(encoding="utf-8")[:200000]
    counts = torch.tensor([chars.count(c) for c in set(chars)], dtype=torch.float64)
    freq = counts / counts.sum()
    unigram = -(freq * freq.log()).sum().item()
    assert summary["final_val_loss"] < summary["initial_val_loss"] - 1.0
    assert summary["final_val_loss"] < unigram
    assert all(h["pseudo_kappa_j"] >= 1.0 for layer in summary["diagnostics"].values() for h in layer)
