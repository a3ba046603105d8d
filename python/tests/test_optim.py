"""kappa.optim against torch.optim, its state, its schedulers and its errors."""
import copy
import io

import pytest
import torch
import torch.optim._muon as torch_muon
from torch_newton_schulz import newton_schulz

import kappa

SHAPES = [(64, 32), (48, 96), (40, 40)]


def params(seed, dtype=torch.float32):
    """Fixed f32 draws, cast to `dtype` (so an f64 run starts from the same values)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in SHAPES]


def grads(seed, like):
    """Fixed f32 draws shaped like `like`, cast to its types."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in like]


def run_torch_muon(ps, steps, monkeypatch, **kw):
    # torch.optim.Muon casts its iteration to bfloat16; the reference runs the same iteration in
    # the tensor's own type, so the comparison is of one algorithm in one precision.
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", newton_schulz)
    opt = torch.optim.Muon(ps, **kw)
    for s in range(steps):
        for p, g in zip(ps, grads(100 + s, ps)):
            p.grad = g
        opt.step()
    return ps


def test_a_step_writes_into_the_parameters_own_storage():
    ps = params(0)
    before = [p.detach().clone() for p in ps]
    pointers = [p.data_ptr() for p in ps]
    opt = kappa.optim.Muon(ps, lr=0.02)
    for p, g in zip(ps, grads(1, ps)):
        p.grad = g
    opt.step()
    assert [p.data_ptr() for p in ps] == pointers
    assert all(not torch.equal(p, b) for p, b in zip(ps, before))


def test_muon_equals_torch_muon_to_the_roundoff_of_torch_itself(monkeypatch):
    steps, kw = 3, dict(lr=0.02, weight_decay=0.1)
    ours = params(0)
    opt = kappa.optim.Muon(ours, precision="f32", **kw)
    for s in range(steps):
        for p, g in zip(ours, grads(100 + s, ours)):
            p.grad = g
        opt.step()
    theirs = run_torch_muon(params(0), steps, monkeypatch, **kw)
    exact = run_torch_muon(params(0, torch.float64), steps, monkeypatch, **kw)
    for a, b, e in zip(ours, theirs, exact):
        # The tolerance is torch's own f32 error against its f64 run, times 4: two f32
        # implementations of one algorithm differ by at most the sum of their roundoff, and
        # kappa's GEMMs sum in a different order than torch's.
        torch_error = (b.double() - e).abs().max().item()
        assert (a - b).abs().max().item() <= 4 * torch_error + 2**-24


def test_muon_adamw_places_and_steps_as_torch_muon_plus_adamw(monkeypatch):
    model = torch.nn.ModuleDict({
        "wte": torch.nn.Embedding(50, 32),
        "fc": torch.nn.Linear(32, 64),
        "lm_head": torch.nn.Linear(64, 50, bias=False),
    })
    opt = kappa.optim.muon_adamw(model.named_parameters(), lr=0.02, adamw_lr=3e-3)
    algorithms = [g["algorithm"] for g in opt.param_groups]
    assert algorithms == ["muon", "adamw", "adamw"]
    names = {id(p): n for n, p in model.named_parameters()}
    assert [names[id(p)] for p in opt.param_groups[0]["params"]] == ["fc.weight"]
    assert sorted(names[id(p)] for p in opt.param_groups[1]["params"]) == ["lm_head.weight", "wte.weight"]
    assert [names[id(p)] for p in opt.param_groups[2]["params"]] == ["fc.bias"]

    reference = copy.deepcopy(model)
    ref = dict(reference.named_parameters())
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", newton_schulz)
    torch_opts = [
        torch.optim.Muon([ref["fc.weight"]], lr=0.02, weight_decay=0.0),
        torch.optim.AdamW([ref["wte.weight"], ref["lm_head.weight"]], lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0),
        torch.optim.AdamW([ref["fc.bias"]], lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0),
    ]
    opt = kappa.optim.muon_adamw(model.named_parameters(), lr=0.02, adamw_lr=3e-3, precision="f32")
    for s in range(3):
        ps = list(model.parameters())
        for (n, p), g in zip(model.named_parameters(), grads(7 + s, ps)):
            p.grad = g
            ref[n].grad = g.clone()
        opt.step()
        for o in torch_opts:
            o.step()
    for n, p in model.named_parameters():
        # AdamW is elementwise (one roundoff per operation: a few ulps of lr); the Muon matrix as
        # in the test above, bounded here by 1e-6 relative to its O(1) entries.
        assert (p - ref[n]).abs().max().item() <= 1e-6, n


def test_the_state_round_trips_exactly_through_torch_save():
    def run(resume):
        ps = params(3)
        opt = kappa.optim.Muon(ps, lr=0.02, normuon=True)
        for s in range(5):
            if s == 3 and resume:
                buffer = io.BytesIO()
                torch.save({"params": [p.detach().clone() for p in ps], "opt": opt.state_dict()}, buffer)
                buffer.seek(0)
                saved = torch.load(buffer)
                ps = [p.requires_grad_() for p in saved["params"]]
                opt = kappa.optim.Muon(ps, lr=0.02, normuon=True)
                opt.load_state_dict(saved["opt"])
            for p, g in zip(ps, grads(50 + s, ps)):
                p.grad = g
            opt.step()
        return ps, opt.steps

    (straight, n1), (resumed, n2) = run(False), run(True)
    assert n1 == n2 == 5
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


def test_a_damaged_state_raises_and_changes_nothing():
    ps = params(4)
    opt = kappa.optim.Muon(ps)
    for p, g in zip(ps, grads(5, ps)):
        p.grad = g
    opt.step()
    state = opt.state_dict()
    good = copy.deepcopy(state)
    state["state"][1]["momentum/0"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="state/1/momentum/0"):
        opt.load_state_dict(state)
    after = opt.state_dict()
    assert all(torch.equal(after["state"][i][k], good["state"][i][k]) for i in good["state"] for k in good["state"][i])


def test_torch_lr_schedulers_drive_the_rate():
    ps = params(6)
    opt = kappa.optim.Muon(ps, lr=0.04)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for s in range(3):
        for p, g in zip(ps, grads(s, ps)):
            p.grad = g
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.005)
    assert opt.state_dict()["param_groups"][0]["lr"] == pytest.approx(0.005)
    assert opt._engine.lr("group0") == pytest.approx(0.01)  # the rate of the last step


def test_a_nan_gradient_raises_naming_the_parameter_and_entry_and_changes_nothing():
    ps = params(8)
    opt = kappa.optim.Muon(ps)
    gs = grads(9, ps)
    gs[2][5, 7] = float("nan")
    for p, g in zip(ps, gs):
        p.grad = g
    before = [p.detach().clone() for p in ps]
    with pytest.raises(ValueError, match=r"`2`.*\(5, 7\)"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(ps, before))
    assert opt.steps == 0


def test_bad_arguments_raise_python_errors():
    with pytest.raises(ValueError, match="unknown msign"):
        kappa.optim.Muon(params(0), msign="newton")
    with pytest.raises(ValueError):
        kappa.optim.Muon([torch.zeros(5, requires_grad=True)])
    with pytest.raises(TypeError):
        kappa.optim.Muon([[1.0, 2.0]])
    opt = kappa.optim.Muon(params(0))
    opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(ValueError, match="momentum changed"):
        opt.step()
    with pytest.raises(ValueError, match="fix their groups"):
        opt.add_param_group({"params": [torch.zeros(3, 3, requires_grad=True)]})


def test_per_head_muon_orthogonalizes_each_head():
    w = torch.randn(4 * 8, 16).requires_grad_()
    spec = kappa.optim.matrix_spec(heads=("rows", 4))
    opt = kappa.optim.Muon([{"params": [w], "matrix": spec}], lr=1.0, weight_decay=0.0, msign="exact", momentum=0.0, nesterov=False)
    start = w.detach().clone()
    w.grad = torch.randn_like(w)
    opt.step()
    step = start - w.detach()
    for head in step.split(8, dim=0):
        gram = head @ head.T  # an 8×16 head: its update has orthonormal rows
        assert torch.allclose(gram, torch.eye(8), atol=1e-5)


def test_manifold_muon_keeps_stiefel_matrices_on_the_manifold():
    ws = [torch.randn(64, 32).requires_grad_(), torch.randn(32, 32).requires_grad_()]
    opt = kappa.optim.ManifoldMuon(ws, lr=0.05, manifold="stiefel")
    for s in range(3):
        for w, g in zip(ws, grads(20 + s, ws)):
            w.grad = g
        opt.step()
    for w in ws:
        gram = w.T @ w
        # The Stiefel retraction is an f32 polar factor: WᵀW = I to the error of an m-term f32
        # dot product per entry (≤ m·u), with a factor 8 for the iteration.
        assert (gram - torch.eye(w.shape[1])).abs().max().item() < 8 * w.shape[0] * 2**-24


def test_split_blocks_and_experts_step_as_separate_matrices():
    g = torch.Generator().manual_seed(11)
    fused = torch.randn(3 * 16, 24, generator=g).requires_grad_()
    experts = torch.randn(4, 16, 24, generator=g).requires_grad_()
    pieces = [fused.detach()[16 * i:16 * (i + 1)].clone().requires_grad_() for i in range(3)]
    pieces += [experts.detach()[e].clone().requires_grad_() for e in range(4)]
    opt = kappa.optim.Muon([
        {"params": [fused], "matrix": kappa.optim.matrix_spec(split=("rows", [16, 16, 16]))},
        {"params": [experts], "matrix": kappa.optim.matrix_spec(dims={"batch": [0], "rows": [1], "cols": [2]})},
    ], lr=0.02, precision="f32")
    separate = kappa.optim.Muon(pieces, lr=0.02, precision="f32")
    for s in range(2):
        gf, ge = torch.randn(fused.shape, generator=g), torch.randn(experts.shape, generator=g)
        fused.grad, experts.grad = gf, ge
        for i, p in enumerate(pieces):
            p.grad = (gf[16 * i:16 * (i + 1)] if i < 3 else ge[i - 3]).clone()
        opt.step()
        separate.step()
    together = list(fused.detach().split(16)) + list(experts.detach().unbind(0))
    for a, b in zip(together, pieces):
        # One algorithm on the same matrices; batched and single GEMMs may sum in other orders
        # (a few f32 ulps of the O(0.02) steps).
        assert (a - b).abs().max().item() <= 1e-6


@pytest.mark.parametrize("manifold,solver", [("stiefel", "admm"), ("dgram", "ascent"), ("oblique", "ascent")])
def test_manifold_muon_keeps_each_manifolds_constraint(manifold, solver):
    g = torch.Generator().manual_seed(12)
    w = torch.randn(48, 16, generator=g).requires_grad_()
    opt = kappa.optim.ManifoldMuon([w], lr=0.05, manifold=manifold, solver=solver)
    for s in range(3):
        w.grad = torch.randn(w.shape, generator=g)
        opt.step()
    gram = (w.T @ w).detach()
    off = gram - torch.diag(torch.diagonal(gram))
    bound = 8 * w.shape[0] * 2**-24 * gram.diagonal().max().item()  # as in the Stiefel test
    if manifold == "stiefel":
        assert (gram - torch.eye(16)).abs().max().item() <= bound
    elif manifold == "dgram":  # orthogonal columns, free norms
        assert off.abs().max().item() <= bound
    else:  # unit columns, free angles
        assert (gram.diagonal() - 1).abs().max().item() <= bound
        assert off.abs().max().item() > 0.01
