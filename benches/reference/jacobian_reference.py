"""PyTorch side of the kappa-attention Jacobian benchmark: the dense weight Jacobian of one
attention head, built by torch.func.jacrev (reverse mode, vmapped over the output entries), f64.

The head is the one the benchmark builds in Rust (benches/benches/attention.rs):
A = softmax(X Wq Wk^T X^T / sqrt(k)) X Wv, with X (N x D) standard normal and each W (D x k)
standard normal scaled by 1/sqrt(D). The values are drawn here with torch's generator, not
copied from the Rust side: the cost of jacrev does not depend on them, and the benchmark checks
kappa's Jacobian against autograd separately.

The script is a small server, so that the benchmark can alternate kappa and jacrev in one run
without paying Python's start-up per sample:

    python jacobian_reference.py --n N --d D --k K --threads T

It builds the Jacobian once (warm-up), prints `ready ROWS COLS`, then for every line `jac` read
from standard input builds it again and prints the seconds that took (time.perf_counter around
the jacrev call only; the result is released afterwards, outside the timed region). `quit` or
end of input exits.
"""

import argparse
import sys
import time

import warnings

# The project's environment has no NumPy (nothing here needs it); torch warns about that on import.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch
from torch.func import jacrev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--d", type=int, required=True)
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(a.seed)
    n, d, k = a.n, a.d, a.k
    x = torch.randn(n, d, dtype=torch.float64, generator=gen)
    ws = [torch.randn(d, k, dtype=torch.float64, generator=gen) / d**0.5 for _ in range(3)]
    s = k**0.5

    def head(wq, wk, wv):
        q, kk, v = x @ wq, x @ wk, x @ wv
        return torch.softmax(q @ kk.T / s, dim=-1) @ v

    jac = jacrev(head, argnums=(0, 1, 2))

    blocks = jac(*ws)
    rows = n * k
    cols = sum(b[0, 0].numel() for b in blocks)
    del blocks
    print(f"ready {rows} {cols}", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if cmd != "jac":
            print(f"error unknown command {cmd!r}", flush=True)
            continue
        t = time.perf_counter()
        blocks = jac(*ws)
        dt = time.perf_counter() - t
        del blocks
        print(f"{dt:.9f}", flush=True)


if __name__ == "__main__":
    main()
