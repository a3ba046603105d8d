"""torch.optim.Muon on a GPT-2-shaped model's hidden matrices plus torch.optim.AdamW on the rest,
stepped on command beside kappa's `Optimizer` (`cargo bench -p kappa-benches --bench optimizer_api`).

Usage: optimizer_torch_peer.py THREADS. Prints one ready line,

  ready TORCH_VERSION mkl_own=A mkl_answer=B

A: what libtorch's MKL would answer to its vendor check `mkl_serv_intel_cpu_true` (1: an Intel
CPU; 0: another vendor, where MKL takes its generic AVX2 kernels); B: the answer MKL gets in this
process (1 when a preloaded library answers "Intel" for it, as kappa's binaries do; "none" where
libtorch has no MKL). Then it answers one line per command:

  setup WIDTH LAYERS VOCAB CONTEXT PRECISION MUON_LR ADAMW_LR
        fresh optimizers over a fresh parameter set (`gpt2_params`: the names and shapes of
        `kappa_benches::gpt2::Gpt2Shape::params`), each parameter with a fixed seeded Gaussian
        gradient that every step reuses; takes one step (the states exist from then on) and
        answers "PARAMETERS TENSORS ADAMW_IMPL": the scalar parameter count, the tensor count,
        and the AdamW implementation torch chose ("for-loop", "foreach" or "fused").
  step  one step of both optimizers; answers its wall seconds.
  quit  exits.

The split is Grouping::muon_adamw's: rank-2 parameters other than wte and wpe to torch.optim.Muon
(lr MUON_LR, weight decay 0, momentum 0.95 with Nesterov, 5 quintic steps, adjust_lr_fn None =
"original": kappa's MuonConfig::keller()); wte and wpe to torch.optim.AdamW with its default weight
decay 0.01, every rank-1 parameter to a second AdamW group with weight decay 0, both at ADAMW_LR and
torch's other defaults (betas (0.9, 0.999), eps 1e-8, foreach=None, fused=None: on CPU tensors torch
resolves that to its per-tensor for-loop, `_single_tensor_adamw`).

PRECISION is "bf16" (torch.optim.Muon as shipped: its Newton-Schulz casts to bfloat16) or "f32"
(its Newton-Schulz swapped for the same iteration in float32, as `muon_torch.py` does).
"""
import ctypes
import os
import sys
import time
import warnings

# The project's environment has no NumPy (nothing here needs it); torch warns about that on import.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch
import torch.optim._muon as muon_module
from torch.optim.optimizer import _default_to_fused_or_foreach
from torch_newton_schulz import newton_schulz_f32

SHIPPED_NEWTON_SCHULZ = muon_module._zeropower_via_newtonschulz
AUXILIARY = ("wte", "wpe")


def gpt2_params(width, layers, vocab, context):
    """(name, shape) of every parameter, as kappa_benches::gpt2::Gpt2Shape::params lists them."""
    d = width
    out = [("wte", (vocab, d)), ("wpe", (context, d))]
    for i in range(layers):
        for name, shape in [
            ("ln_1.weight", (d,)),
            ("ln_1.bias", (d,)),
            ("attn.c_attn.weight", (3 * d, d)),
            ("attn.c_attn.bias", (3 * d,)),
            ("attn.c_proj.weight", (d, d)),
            ("attn.c_proj.bias", (d,)),
            ("ln_2.weight", (d,)),
            ("ln_2.bias", (d,)),
            ("mlp.c_fc.weight", (4 * d, d)),
            ("mlp.c_fc.bias", (4 * d,)),
            ("mlp.c_proj.weight", (d, 4 * d)),
            ("mlp.c_proj.bias", (d,)),
        ]:
            out.append((f"h.{i}.{name}", shape))
    out += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return out


def mkl_vendor_answers():
    """(libtorch's own answer to MKL's vendor check, the answer MKL gets in this process):
    libtorch_cpu.so calls the check through its PLT, so a definition earlier in the global
    lookup scope (the executable's, a preloaded library's) answers for it."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")

    def lookup(handle):
        try:
            f = handle.mkl_serv_intel_cpu_true
        except AttributeError:
            return None
        f.restype, f.argtypes = ctypes.c_int, []
        return f

    try:
        own = lookup(ctypes.CDLL(lib))
    except OSError:
        own = None
    if own is None:
        return "none", "none"
    seen = lookup(ctypes.CDLL(None)) or own
    return str(own()), str(seen())


def setup(width, layers, vocab, context, precision, muon_lr, adamw_lr):
    muon_module._zeropower_via_newtonschulz = {
        "bf16": SHIPPED_NEWTON_SCHULZ,
        "f32": newton_schulz_f32,
    }[precision]
    g = torch.Generator().manual_seed(1)
    hidden, decay, no_decay = [], [], []
    for name, shape in gpt2_params(width, layers, vocab, context):
        p = torch.nn.Parameter(torch.randn(shape, generator=g) * 0.02)
        p.grad = torch.randn(shape, generator=g)
        if name in AUXILIARY:
            decay.append(p)
        elif p.dim() == 2:
            hidden.append(p)
        else:
            no_decay.append(p)
    muon = torch.optim.Muon(
        hidden, lr=muon_lr, weight_decay=0.0, momentum=0.95, nesterov=True
    )
    adamw = torch.optim.AdamW(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=adamw_lr
    )
    optimizers = (muon, adamw)
    step(optimizers)
    every = hidden + decay + no_decay
    fused, foreach = _default_to_fused_or_foreach(every, False, False)
    impl = "fused" if fused else "foreach" if foreach else "for-loop"
    count = sum(p.numel() for p in every)
    return optimizers, f"{count} {len(every)} {impl}"


def step(optimizers):
    t0 = time.perf_counter()
    for opt in optimizers:
        opt.step()
    return time.perf_counter() - t0


def main():
    torch.set_num_threads(int(sys.argv[1]))
    own, answer = mkl_vendor_answers()
    print(f"ready {torch.__version__} mkl_own={own} mkl_answer={answer}", flush=True)
    optimizers = None
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "setup" and len(words) == 8:
            optimizers = None  # the previous set's memory goes before the next is made
            sizes = [int(w) for w in words[1:5]]
            optimizers, reply = setup(*sizes, words[5], float(words[6]), float(words[7]))
        elif words[0] == "step" and optimizers is not None:
            reply = str(step(optimizers))
        else:
            reply = f"error: unknown command {line.strip()!r}"
        print(reply, flush=True)


if __name__ == "__main__":
    main()
