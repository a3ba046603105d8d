"""kappa.attention's weight Jacobian from Python against torch.func.jacrev, for one head of
ViT-Tiny's shape (N = 197 tokens, D = 192, k = 64), in f64.

    python python/benches/jacobian.py [--rounds 3] [--threads 1] [--json OUT]

Both compute the three blocks ∂vec A/∂vec W_• (each (N·k) × (D·k), 1.2 GB in f64); kappa writes
them straight into fresh torch tensors (backed by transparent huge pages where the kernel
offers them). After one untimed call of each, rounds alternate the two; the speed-up is per
round, reported as median [min–max].
"""

import argparse
import json
import pathlib
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=197)
    p.add_argument("--d", type=int, default=192)
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args()
    import os

    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))  # kappa's fill runs on rayon
    import torch

    import kappa
    from kappa import attention

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.d, generator=g, dtype=torch.float64)
    ws = [torch.randn(args.d, args.k, generator=g, dtype=torch.float64) / args.d**0.5 for _ in range(3)]

    def head(wq, wk, wv):
        return torch.softmax(x @ wq @ (x @ wk).T, dim=-1) @ (x @ wv)

    def theirs():
        return torch.func.jacrev(head, argnums=(0, 1, 2))(*ws)

    def ours():
        return attention.weight_jacobian_blocks(x, *ws)

    # One untimed call of each first: a process's first gigabytes of fresh memory cost the
    # operating system's first touch (and, in a virtual machine, the host's), whoever asks.
    ours()
    theirs()
    speedups = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        mine = ours()
        a = time.perf_counter() - start
        del mine
        start = time.perf_counter()
        ref = theirs()
        b = time.perf_counter() - start
        del ref
        speedups.append(b / a)
        print(f"kappa {a:.2f} s, torch.func.jacrev {b:.2f} s: {b / a:.1f}×", flush=True)
    s = {"median": statistics.median(speedups), "min": min(speedups), "max": max(speedups)}
    print(f"speed-up of kappa over jacrev (N={args.n}, D={args.d}, k={args.k}, {args.threads} thread(s)): "
          f"{s['median']:.1f}× [{s['min']:.1f}–{s['max']:.1f}]")
    if args.json:
        from optim_step import cpu_model

        args.json.write_text(json.dumps({"bench": "python jacobian", "cpu": cpu_model(), "speedup": s, "args": vars(args) | {"json": None},
                                         "torch": torch.__version__, "command": " ".join([sys.executable] + sys.argv)}))


if __name__ == "__main__":
    main()
