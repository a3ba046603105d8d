"""kappa.optim.Muon.step() from Python against torch.optim.Muon, and against the same kappa step
driven from Rust (the cost of the Python boundary), on GPT-2-small-shaped matrices.

    python python/benches/optim_step.py --threads 1 [--quick] [--json OUT]

Sets: `block` (one GPT-2-small block: c_attn 2304×768, attn c_proj 768×768, c_fc 3072×768,
mlp c_proj 768×3072) and `12-layer` (twelve such blocks). Precisions: `f32` (kappa's f32
iteration against torch.optim.Muon with its Newton–Schulz swapped for the same iteration in f32,
benches/reference/torch_newton_schulz.py) and `bf16` (kappa's bf16 iteration against stock
torch.optim.Muon, which always iterates in bf16). Each round times one step of each side,
alternating (kappa, torch, kappa-from-Rust), after warm-up steps; the ratios are per round and
reported as median [min–max].
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches" / "reference"))

BLOCK = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make(shapes, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=g).mul_(0.02).requires_grad_() for s in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    return ps


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(shapes, precision, rounds, warmup):
    import torch
    import torch.optim._muon as torch_muon
    from torch_newton_schulz import newton_schulz_f32

    import kappa

    stock = torch_muon._zeropower_via_newtonschulz
    torch_muon._zeropower_via_newtonschulz = newton_schulz_f32 if precision == "f32" else stock
    ours = kappa.optim.Muon(make(shapes, 0), lr=0.02, precision=precision)
    theirs = torch.optim.Muon(make(shapes, 0), lr=0.02)
    for _ in range(warmup):
        ours.step()
        theirs.step()
        ours._engine.step_repeated(1)
    vs_torch, boundary = [], []
    for _ in range(rounds):
        a = timed(ours.step)
        b = timed(theirs.step)
        c = timed(lambda: ours._engine.step_repeated(1))
        vs_torch.append(a / b)
        boundary.append(a / c)
    torch_muon._zeropower_via_newtonschulz = stock
    return vs_torch, boundary


def summary(ratios):
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="3 rounds of the block set only")
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    sets = {"block": BLOCK} if args.quick else {"block": BLOCK, "12-layer": BLOCK * 12}
    rows = []
    for name, shapes in sets.items():
        for precision in ("f32", "bf16"):
            rounds = 3 if args.quick else (15 if name == "block" else 7)
            vs_torch, boundary = measure(shapes, precision, rounds, warmup=2)
            row = {"set": name, "precision": precision, "threads": args.threads,
                   "kappa_over_torch": summary(vs_torch), "python_over_rust": summary(boundary)}
            rows.append(row)
            t, b = row["kappa_over_torch"], row["python_over_rust"]
            print(f"{name:8} {precision:4} threads {args.threads}: kappa/torch {t['median']:.3f} "
                  f"[{t['min']:.3f}–{t['max']:.3f}], python/rust {b['median']:.3f} [{b['min']:.3f}–{b['max']:.3f}]",
                  flush=True)
    out = {"bench": "python optim_step", "cpu": cpu_model(), "torch": torch.__version__, "rows": rows,
           "command": " ".join([sys.executable] + sys.argv)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
