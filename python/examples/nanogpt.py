"""A small character-level GPT trained with kappa's Muon (AdamW on embeddings, head, gains),
in plain PyTorch, printing the attention diagnostics of each head as it trains.

    python python/examples/nanogpt.py --steps 300            # data/sotu/train.txt
    python python/examples/nanogpt.py --text my.txt --correction identity --lam 0.5
    python python/examples/nanogpt.py --optimizer modulewise --preset HETERO

The text defaults to the `sotu` registry set (`cargo xtask setup --data sotu` installs it).
The last line printed is a JSON summary (initial and final validation loss, diagnostics).
"""

import argparse
import json
import math
import os
import pathlib
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch
from torch import nn

import kappa
from kappa.attention import ConditionedMultiheadAttention, DiagnosticsHook

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Block(nn.Module):
    def __init__(self, d, heads, args):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = ConditionedMultiheadAttention(
            d, heads, correction=args.correction, lam=args.lam, causal=True
        )
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, args):
        super().__init__()
        self.wte = nn.Embedding(vocab, args.width)
        self.wpe = nn.Embedding(args.context, args.width)
        self.blocks = nn.Sequential(*[Block(args.width, args.heads, args) for _ in range(args.layers)])
        self.ln_f = nn.LayerNorm(args.width)
        self.lm_head = nn.Linear(args.width, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.lm_head(self.ln_f(self.blocks(self.wte(idx) + self.wpe(pos))))


def batches(data, args, generator):
    while True:
        starts = torch.randint(len(data) - args.context - 1, (args.batch,), generator=generator)
        x = torch.stack([data[s:s + args.context] for s in starts])
        y = torch.stack([data[s + 1:s + args.context + 1] for s in starts])
        yield x, y


@torch.no_grad()
def evaluate(model, data, args):
    generator = torch.Generator().manual_seed(1234)
    losses = []
    for _, (x, y) in zip(range(args.eval_batches), batches(data, args, generator)):
        logits = model(x)
        losses.append(nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    return sum(losses) / len(losses)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data_dir = pathlib.Path(os.environ.get("KAPPA_DATA", ROOT / "data"))
    p.add_argument("--text", type=pathlib.Path, default=data_dir / "sotu" / "train.txt")
    p.add_argument("--chars", type=int, default=2_000_000, help="characters of the text used")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--optimizer", choices=["muon_adamw", "modulewise"], default="muon_adamw")
    p.add_argument("--preset", default="HETERO", help="the module-wise preset (with --optimizer modulewise)")
    p.add_argument("--lr", type=float, default=0.02, help="Muon's rate")
    p.add_argument("--adamw-lr", type=float, default=3e-3)
    p.add_argument("--correction", choices=["none", "identity", "svd"], default="none")
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--report-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    args.correction = None if args.correction == "none" else args.correction
    if not args.text.is_file():
        raise SystemExit(f"{args.text} not found: run `cargo xtask setup --data sotu` or pass --text")

    torch.manual_seed(args.seed)
    text = args.text.read_text(encoding="utf-8")[: args.chars]
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([index[c] for c in text])
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]

    model = GPT(len(vocab), args)
    if args.optimizer == "modulewise":
        opt = kappa.optim.modulewise(model.named_parameters(), preset=args.preset, muon_lr=args.lr, lr=args.adamw_lr)
    else:
        opt = kappa.optim.muon_adamw(model.named_parameters(), lr=args.lr, adamw_lr=args.adamw_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    hook = DiagnosticsHook(model, every=args.report_every, max_tokens=16)

    initial = evaluate(model, val, args)
    print(f"step 0: val loss {initial:.3f} (uniform {math.log(len(vocab)):.3f})")
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    for step, (x, y) in zip(range(1, args.steps + 1), batches(train, args, generator)):
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % args.report_every == 0 or step == args.steps:
            report = hook.report()
            heads = [h for layer in report.values() for h in layer]
            print(
                f"step {step}: train loss {loss.item():.3f}, "
                f"max logit {max(h['max_logit'] for h in heads):.2f}, "
                f"max κ⁺(J) {max(h['pseudo_kappa_j'] for h in heads):.3g}, "
                f"mean entropy {sum(h['mean_entropy'] for h in heads) / len(heads):.3f}"
            )
    final = evaluate(model, val, args)
    hook.remove()
    seconds = time.perf_counter() - started
    print(f"step {args.steps}: val loss {final:.3f} ({seconds:.1f} s)")
    print(json.dumps({"initial_val_loss": initial, "final_val_loss": final, "steps": args.steps,
                      "seconds": seconds, "diagnostics": report}))


if __name__ == "__main__":
    main()
