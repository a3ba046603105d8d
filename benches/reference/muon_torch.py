"""torch.optim.Muon side by side with kappa's Muon (called by `cargo bench --bench optim`).

Usage: muon_torch.py THREADS MxN [MxN ...]
Prints one JSON object: {"MxN": {"seconds": median seconds per step, "reps": n,
"sigma_min": ..., "sigma_max": ...}} where sigma_* are the extreme singular values of the
orthogonalized update O = -(W_after - W_before)/adjusted_lr (weight decay 0), i.e. the band
torch's bf16 Newton-Schulz lands in. Inputs are seeded Gaussians in f32 on the CPU, the same
setting (momentum 0.95 Nesterov, 5 quintic steps, adjust_lr_fn="original") as kappa's
`MuonConfig::keller()`.
"""
import json
import math
import sys
import time

import warnings

# The project's environment has no NumPy (nothing here needs it); torch warns about that on import.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch


def bench(m, n, budget=3.0, max_reps=5):
    g = torch.Generator().manual_seed(1)
    w = torch.nn.Parameter(torch.randn(m, n, generator=g) * 0.02)
    grad = torch.randn(m, n, generator=g)
    opt = torch.optim.Muon([w], lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True)
    w.grad = grad.clone()
    before = w.detach().clone()
    opt.step()  # warm-up, also gives the update for the band check
    adjusted = 0.02 * math.sqrt(max(1.0, m / n))
    update = -(w.detach() - before) / adjusted
    s = torch.linalg.svdvals(update.double())
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (time.perf_counter() - start < budget or len(times) < 1):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "seconds": times[len(times) // 2],
        "reps": len(times),
        "sigma_min": s.min().item(),
        "sigma_max": s.max().item(),
    }


def main():
    threads = int(sys.argv[1])
    torch.set_num_threads(threads)
    out = {}
    for shape in sys.argv[2:]:
        m, n = (int(x) for x in shape.split("x"))
        out[shape] = bench(m, n)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
