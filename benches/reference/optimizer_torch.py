"""torch.optim.Muon on a GPT's hidden matrices plus torch.optim.AdamW on the rest, stepped on fixed
parameters and gradients: the reference of crates/optim/tests/torch_reference.rs.

Usage: optimizer_torch.py INPUT.json OUTPUT.json

INPUT holds
  muon_lr, adamw_lr     the two optimizers' peak learning rates;
  lr_factors            one factor per step: step i runs at peak * lr_factors[i] (every group);
  params                [{"name", "shape", "data"}]: the parameters' initial values (f32 values
                        written as decimal doubles, data flat in row-major order);
  grads                 one list per step, one flat list per parameter (in the order of params).

The parameters are split as a GPT training script splits them: the hidden matrices (rank 2, inside
the blocks `h.*`) to torch.optim.Muon at its defaults; every other matrix (the token embedding and
the output head) to torch.optim.AdamW at its defaults; gains and biases (rank < 2) to a second
AdamW group with weight decay 0. Only the learning rates are set.

torch.optim.Muon runs its Newton-Schulz in bfloat16; here the module's function is swapped for the
same iteration in the tensor's own type (`newton_schulz`), so the f32 run is torch.optim.Muon in
f32, as kappa's `Precision::F32`. Everything else is torch's own optimizer code.

OUTPUT holds
  torch                 torch.__version__;
  defaults              {"muon", "adamw"}: the constructor defaults of torch.optim.Muon and
                        torch.optim.AdamW (lists for tuples, null for None);
  groups                {"muon", "adamw", "adamw_no_decay"}: the parameter names of each group;
  steps                 one object per step: each parameter's f32 values after that step;
  probe                 one object per step: for each parameter, max |Δ| between two float64 runs
                        of the same optimizers, one on the inputs and one on the inputs perturbed by
                        PROBE * max|x| per entry (random signs, seeded): the effect of a rounding
                        of relative size 2^-24 at the inputs, which the test's tolerance scales.
"""
import json
import sys
import warnings

# The project's environment has no NumPy (nothing here needs it); torch warns about that on import.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch
import torch.optim._muon as muon_module
from torch_newton_schulz import newton_schulz

# The perturbation of the probe relative to each input's largest entry: f32's unit roundoff.
PROBE = 2.0**-24

# The groups, named as kappa's `Grouping::muon_adamw` names them.
GROUPS = ("muon", "adamw", "adamw_no_decay")


def group_of(name, shape):
    """The group of a parameter, by its place in the model: gains and biases (rank < 2) without
    weight decay, matrices inside the blocks to Muon, the other matrices (embedding, head) to AdamW
    with weight decay."""
    if len(shape) < 2:
        return "adamw_no_decay"
    return "muon" if name.startswith("h.") else "adamw"


def run(spec, dtype, perturb):
    """Steps the two optimizers through spec's gradients in `dtype`; returns the parameters after
    each step ({name: tensor} per step). `perturb`: add PROBE * max|x| with a seeded random sign to
    every entry of every input (initial values and gradients)."""
    gen = torch.Generator().manual_seed(0x5EED)

    def tensor(data, shape):
        x = torch.tensor(data, dtype=torch.float64).reshape(shape)
        if perturb:
            sign = torch.randn(x.shape, generator=gen, dtype=torch.float64).sign()
            x = x + PROBE * x.abs().max() * sign
        return x.to(dtype)

    shapes = {p["name"]: p["shape"] for p in spec["params"]}
    params = {
        p["name"]: torch.nn.Parameter(tensor(p["data"], p["shape"])) for p in spec["params"]
    }
    grads = [
        {name: tensor(g, shapes[name]) for name, g in zip(params, step)}
        for step in spec["grads"]
    ]
    placed = {n: group_of(n, shapes[n]) for n in params}
    members = {g: [p for n, p in params.items() if placed[n] == g] for g in GROUPS}
    muon = torch.optim.Muon(members["muon"], lr=spec["muon_lr"])
    adamw = torch.optim.AdamW(
        [
            {"params": members["adamw"]},
            {"params": members["adamw_no_decay"], "weight_decay": 0.0},
        ],
        lr=spec["adamw_lr"],
    )
    after = []
    for step, factor in enumerate(spec["lr_factors"]):
        for opt, peak in ((muon, spec["muon_lr"]), (adamw, spec["adamw_lr"])):
            for group in opt.param_groups:
                group["lr"] = peak * factor
        for name, p in params.items():
            p.grad = grads[step][name].clone()
        muon.step()
        adamw.step()
        after.append({n: p.detach().clone() for n, p in params.items()})
    return after, placed


def defaults():
    """The constructor defaults of torch.optim.Muon and torch.optim.AdamW."""
    p = [torch.nn.Parameter(torch.zeros(2, 2))]
    return {
        "muon": torch.optim.Muon(p).defaults,
        "adamw": torch.optim.AdamW(p).defaults,
    }


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: optimizer_torch.py INPUT.json OUTPUT.json")
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    if not hasattr(muon_module, "_zeropower_via_newtonschulz"):
        sys.exit("torch.optim._muon has no _zeropower_via_newtonschulz to run in f32")
    calls = [0]

    def counted(*args):
        calls[0] += 1
        return newton_schulz(*args)

    muon_module._zeropower_via_newtonschulz = counted
    steps, placed = run(spec, torch.float32, perturb=False)
    expected = len(spec["lr_factors"]) * sum(g == "muon" for g in placed.values())
    if calls[0] != expected:
        sys.exit(f"torch.optim.Muon called the f32 Newton-Schulz {calls[0]} times, not {expected}")
    exact, _ = run(spec, torch.float64, perturb=False)
    moved, _ = run(spec, torch.float64, perturb=True)
    out = {
        "torch": torch.__version__,
        "defaults": defaults(),
        "groups": {g: [n for n in placed if placed[n] == g] for g in GROUPS},
        "steps": [{n: t.reshape(-1).tolist() for n, t in s.items()} for s in steps],
        "probe": [
            {n: (m[n] - e[n]).abs().max().item() for n in e} for e, m in zip(exact, moved)
        ],
    }
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
