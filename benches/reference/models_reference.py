"""PyTorch eager reference for the kappa-models training-step benchmark.

The same GPT and ViT as kappa-models (crates/models): fused QKV projection, optional
lambda*I shift folded into the weight as W + lambda*E (E = [I; I; I], the "shifted" layout; one
addcmul per forward, as kappa does), pre-LN
blocks, exact GELU MLP, learned positions, tied GPT head, ViT patch convolution and class token,
and one training step = zero_grad, forward, backward, clip_grad_norm_(1.0), AdamW (decay and
no-decay parameter groups, nanoGPT's) -- timed with time.perf_counter, median over steps.

The step is what a PyTorch user gets by default: torch.optim.AdamW with no foreach/fused
argument (on the CPU PyTorch picks its single-tensor loop), optimizer.zero_grad() with its
default set_to_none=True (gradients dropped), clip_grad_norm_ with its default (foreach on the
CPU).

Usage: python models_reference.py --model gpt|vit --config JSON --lam L --threads N --steps S
Prints one JSON object: {"seconds_per_step": ..., "steps": ..., "threads": ...}.

With --serve it builds the model, prints "ready", then reads commands from stdin, one a line:
"step" runs one training step and prints "<wall seconds> <process CPU seconds>" of it;
"quit" (or the end of stdin) exits. The benchmark uses this to alternate single steps of
kappa and PyTorch in one run.
"""

import argparse
import json
import math
import statistics
import sys
import time

import warnings

# The project's environment has no NumPy (nothing here needs it); torch warns about that on import.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    def __init__(self, d, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self, d, h, bias, causal, lam, proj_std):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)
        nn.init.normal_(self.c_attn.weight, std=0.02)
        nn.init.normal_(self.c_proj.weight, std=proj_std)
        for lin in (self.c_attn, self.c_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        self.h, self.causal = h, causal
        # lambda is a buffer: never trained, never in the optimizer.
        self.register_buffer("lam", torch.tensor(float(lam)) if lam > 0 else None)
        self.register_buffer("pattern", torch.eye(d).repeat(3, 1) if lam > 0 else None,
                             persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        if self.lam is not None:
            w = torch.addcmul(self.c_attn.weight, self.pattern, self.lam)
            qkv = F.linear(x, w, self.c_attn.bias)
        else:
            qkv = self.c_attn(x)
        q, k, v = qkv.split(d, dim=-1)
        k_ = d // self.h
        q, k, v = (m.view(b, t, self.h, k_).transpose(1, 2) for m in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=1.0 / math.sqrt(k_))
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Block(nn.Module):
    def __init__(self, d, h, r, bias, causal, lam, proj_std):
        super().__init__()
        self.ln_1 = LayerNorm(d, bias)
        self.attn = Attention(d, h, bias, causal, lam, proj_std)
        self.ln_2 = LayerNorm(d, bias)
        self.c_fc = nn.Linear(d, r * d, bias=bias)
        self.c_proj = nn.Linear(r * d, d, bias=bias)
        nn.init.normal_(self.c_fc.weight, std=0.02)
        nn.init.normal_(self.c_proj.weight, std=proj_std)
        for lin in (self.c_fc, self.c_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, c, lam):
        super().__init__()
        d, L = c["n_embd"], c["n_layer"]
        self.wte = nn.Parameter(torch.randn(c["vocab_size"], d) * 0.02)
        self.wpe = nn.Parameter(torch.randn(c["block_size"], d) * 0.02)
        std = 0.02 / math.sqrt(2 * L)
        self.h = nn.ModuleList(
            Block(d, c["n_head"], c["mlp_ratio"], c["bias"], True, lam, std) for _ in range(L)
        )
        self.ln_f = LayerNorm(d, c["bias"])

    def loss(self, idx, targets):
        t = idx.shape[1]
        x = F.embedding(idx, self.wte) + self.wpe[:t]
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class ViT(nn.Module):
    def __init__(self, c, lam):
        super().__init__()
        d, L, p = c["n_embd"], c["n_layer"], c["patch_size"]
        n = (c["image_size"] // p) ** 2 + 1
        self.patch_embed = nn.Parameter(torch.randn(d, c["channels"], p, p) * 0.02)
        self.patch_bias = nn.Parameter(torch.zeros(d))
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n, d) * 0.02)
        std = 0.02 / math.sqrt(2 * L)
        self.h = nn.ModuleList(
            Block(d, c["n_head"], c["mlp_ratio"], c["bias"], False, lam, std) for _ in range(L)
        )
        self.ln_f = LayerNorm(d, c["bias"])
        self.head = nn.Linear(d, c["num_classes"], bias=c["bias"])
        nn.init.normal_(self.head.weight, std=0.02)
        self.p = p

    def loss(self, images, labels):
        x = F.conv2d(images, self.patch_embed, self.patch_bias, stride=self.p).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for b in self.h:
            x = b(x)
        return F.cross_entropy(self.head(self.ln_f(x)[:, 0]), labels)


EMBEDDINGS = ("wte", "wpe", "pos_embed", "cls_token")


def groups(model, wd):
    decay, rest = [], []
    for name, p in sorted(model.named_parameters()):
        if p.dim() >= 2 and name.split(".")[-1] not in EMBEDDINGS:
            decay.append(p)
        else:
            rest.append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["gpt", "vit"], required=True)
    ap.add_argument("--config", required=True, help="the kappa-models config as JSON")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--lam", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="forward pass under bf16 autocast")
    ap.add_argument("--serve", action="store_true", help="step on command (see the module docs)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = json.loads(a.config)
    if a.model == "gpt":
        model = GPT(c, a.lam)
        x = torch.randint(c["vocab_size"], (a.batch, c["block_size"]))
        y = x
    else:
        model = ViT(c, a.lam)
        x = torch.randn(a.batch, c["channels"], c["image_size"], c["image_size"])
        y = torch.randint(c["num_classes"], (a.batch,))
    opt = torch.optim.AdamW(groups(model, 0.1), lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    def loss():
        if a.bf16:
            # What torch.autocast users write: the forward pass under bf16 autocast, the
            # backward pass outside it.
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model.loss(x, y)
        return model.loss(x, y)

    def step():
        opt.zero_grad()
        loss().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(a.warmup):
        step()
    if a.serve:
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "step":
                break
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            print(f"{time.perf_counter() - t0} {time.process_time() - c0}", flush=True)
        return
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"seconds_per_step": statistics.median(times), "steps": a.steps,
                      "threads": a.threads, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
