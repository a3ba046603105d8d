"""torch.optim.Muon, stepped on command beside kappa's Muon (`cargo bench --bench optim`).

Usage: muon_torch.py THREADS. Prints "ready", then answers one line per command:

  setup SHAPES PRECISION
                        a fresh torch.optim.Muon on seeded Gaussian parameters, one per shape of
                        SHAPES (MxN, or several joined by commas: a GPT layer's matrices in one
                        optimizer), each with a fixed seeded Gaussian gradient; takes one step
                        and answers "sigma_min sigma_max", the extreme singular values over the
                        parameters of that step's orthogonalized update
                        O = -(W_after - W_before)/adjusted_lr (weight decay 0), i.e. the band its
                        Newton-Schulz lands in.
  step                  one optimizer step on the current parameter; answers its wall seconds.
  quit                  exits.

PRECISION is "bf16" (torch.optim.Muon as shipped: its Newton-Schulz casts to bfloat16) or "f32"
(the same optimizer with its Newton-Schulz run in float32; see `newton_schulz_f32`). The setting
is the one of kappa's `MuonConfig::keller()`: momentum 0.95 with Nesterov, 5 quintic steps,
adjust_lr_fn="original".
"""
import math
import sys
import time
import warnings

# The project's environment has no NumPy (nothing here needs it); torch warns about that on import.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch
import torch.optim._muon as muon_module
from torch_newton_schulz import newton_schulz_f32

SHIPPED_NEWTON_SCHULZ = muon_module._zeropower_via_newtonschulz


def setup(shapes, precision):
    muon_module._zeropower_via_newtonschulz = {
        "bf16": SHIPPED_NEWTON_SCHULZ,
        "f32": newton_schulz_f32,
    }[precision]
    g = torch.Generator().manual_seed(1)
    params = []
    for shape in shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        w = torch.nn.Parameter(torch.randn(m, n, generator=g) * 0.02)
        w.grad = torch.randn(m, n, generator=g)
        params.append(w)
    opt = torch.optim.Muon(params, lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True)
    before = [w.detach().clone() for w in params]
    opt.step()
    lo, hi = math.inf, 0.0
    for w, b in zip(params, before):
        m, n = w.shape
        update = -(w.detach() - b) / (0.02 * math.sqrt(max(1.0, m / n)))
        s = torch.linalg.svdvals(update.double())
        lo, hi = min(lo, s.min().item()), max(hi, s.max().item())
    return opt, f"{lo} {hi}"


def main():
    torch.set_num_threads(int(sys.argv[1]))
    opt = None
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "setup":
            opt, reply = setup(words[1], words[2])
        elif words[0] == "step" and opt is not None:
            t0 = time.perf_counter()
            opt.step()
            reply = str(time.perf_counter() - t0)
        else:
            reply = f"error: unknown command {line.strip()!r}"
        print(reply, flush=True)


if __name__ == "__main__":
    main()
