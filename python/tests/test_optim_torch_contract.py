"""What a torch.optim user relies on beyond the arithmetic: group defaults, settings that a
loaded state or a scheduler may not change, gradients changed after clipping, layouts kappa
cannot read, and calls from several threads."""
import threading

import pytest
import torch

import kappa


def matrices(seed, shapes=((24, 16), (16, 16))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]


def fill_grads(ps, seed):
    g = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


def test_a_group_of_another_algorithm_takes_that_algorithms_defaults():
    w, b = matrices(0)[0], torch.zeros(16, requires_grad=True)
    opt = kappa.optim.Muon([{"params": [w]}, {"params": [b], "algorithm": "adamw"}], lr=0.02)
    muon, adamw = opt.param_groups
    assert (muon["lr"], muon["weight_decay"]) == (0.02, 0.1)
    assert (adamw["lr"], adamw["weight_decay"], adamw["betas"]) == (1e-3, 0.01, (0.9, 0.999))
    # What the group sets itself wins.
    opt = kappa.optim.Muon([{"params": [w]}, {"params": [b], "algorithm": "adamw", "lr": 3e-4}], lr=0.02)
    assert opt.param_groups[1]["lr"] == 3e-4


def test_loading_a_state_saved_with_other_settings_raises_and_changes_nothing():
    ps = matrices(1)
    opt = kappa.optim.Muon(ps, lr=0.02, momentum=0.9)
    fill_grads(ps, 2)
    opt.step()
    state = opt.state_dict()
    other = kappa.optim.Muon(matrices(1), lr=0.02, momentum=0.95)
    with pytest.raises(ValueError, match="momentum differ"):
        other.load_state_dict(state)
    assert other.steps == 0 and other.param_groups[0]["momentum"] == 0.95
    same = kappa.optim.Muon(matrices(1), lr=0.05, momentum=0.9)
    same.load_state_dict(state)  # lr is not a fixed setting: the state's is taken
    assert same.steps == 1 and same.param_groups[0]["lr"] == 0.02


def test_one_cycle_lr_drives_the_rate_and_momentum_cycling_is_refused_by_name():
    ps = matrices(3)
    opt = kappa.optim.Muon(ps, lr=0.02)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.04, total_steps=4, cycle_momentum=False)
    rates = []
    for s in range(3):
        fill_grads(ps, 10 + s)
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        assert opt._engine.lr("group0") == rates[-1]  # the rate this step ran at
        sched.step()
    assert len(set(rates)) == 3  # the schedule moved the rate at every step
    cycling = kappa.optim.Muon(matrices(3), lr=0.02)
    sched = torch.optim.lr_scheduler.OneCycleLR(cycling, max_lr=0.04, total_steps=4)
    fill_grads(cycling.param_groups[0]["params"], 20)
    cycling.step()  # OneCycleLR starts at the optimizer's own momentum
    sched.step()
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        cycling.step()


def test_a_gradient_changed_after_clipping_is_checked_again():
    ps = matrices(4)
    bias = torch.zeros(16, requires_grad=True)
    opt = kappa.optim.Muon([{"params": ps}, {"params": [bias], "algorithm": "adamw"}], lr=0.02)
    for spoil in (lambda: ps[1].grad.__setitem__((3, 4), float("nan")),
                  lambda: bias.grad.__setitem__(5, float("inf"))):
        fill_grads(ps + [bias], 5)
        assert opt.clip_grad_norm_(1.0) > 1.0
        spoil()  # after the clip computed a finite norm
        before = [p.detach().clone() for p in ps + [bias]]
        with pytest.raises(ValueError, match="non-finite"):
            opt.step()
        assert all(torch.equal(p, b) for p, b in zip(ps + [bias], before))
        opt.zero_grad()
    assert opt.steps == 0


def test_sparse_gradients_and_tensors_are_errors_not_panics():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = kappa.optim.AdamW(emb.parameters(), lr=0.1)
    emb(torch.tensor([1, 2])).sum().backward()
    assert emb.weight.grad.is_sparse
    with pytest.raises(ValueError, match="sparse"):
        opt.step()
    with pytest.raises(ValueError, match="sparse"):
        opt.clip_grad_norm_(1.0)
    fill_grads([emb.weight], 6)  # the optimizer is usable after the errors
    opt.step()
    assert opt.steps == 1
    with pytest.raises(TypeError, match="dense"):
        kappa.optim.AdamW([torch.eye(3).to_sparse().requires_grad_()])


def test_impossible_head_counts_and_split_sizes_are_value_errors():
    for spec in (kappa.optim.matrix_spec(heads=("rows", 2**40)),
                 kappa.optim.matrix_spec(split=("rows", [2**64 - 1, 25]))):
        with pytest.raises(ValueError):
            kappa.optim.Muon([{"params": matrices(7)[:1], "matrix": spec}])


def test_threads_calling_one_optimizer_wait_for_each_other():
    ps = matrices(8, shapes=((256, 256),) * 4)
    opt = kappa.optim.Muon(ps, lr=0.02)
    fill_grads(ps, 9)
    errors = []

    def work():
        try:
            opt._engine.step()
            _ = opt.steps
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and opt.steps == 4
