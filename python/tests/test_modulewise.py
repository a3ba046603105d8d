"""kappa.optim.modulewise: the manifold paper's module-wise optimizer on PyTorch models."""
import io

import pytest
import torch
from torch import nn

import kappa
from kappa.optim import module_label

D = 16


class NanoBlock(nn.Module):
    """nanoGPT's block names: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, ln_1, ln_2."""

    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(D, dim=2)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(nn.functional.gelu(self.mlp.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab=11, context=8, layers=2):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, D), wpe=nn.Embedding(context, D),
            h=nn.ModuleList([NanoBlock() for _ in range(layers)]), ln_f=nn.LayerNorm(D),
        ))
        self.lm_head = nn.Linear(D, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in nanoGPT

    def forward(self, idx):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


def model(seed=0):
    torch.manual_seed(seed)
    return NanoGPT()


def batch(step):
    """A fixed task: predict the next token of a counting sequence mod 11."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(11, (8, 1), generator=g)
    seq = (start + torch.arange(9)) % 11
    return seq[:, :-1], seq[:, 1:]


def loss_of(m, step):
    x, y = batch(step)
    return nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())


def constraint_gap(w, manifold):
    """How far a matrix is from its manifold, on the Gram matrix of its shorter side."""
    w = w.detach()
    gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    off = gram - torch.diag(torch.diagonal(gram))
    if manifold == "stiefel":
        return (gram - torch.eye(gram.shape[0])).abs().max().item()
    return off.abs().max().item()  # dgram: orthogonal, free norms


def test_names_of_common_models_get_their_module_labels():
    linear = torch.zeros(8, 4)
    cases = {
        "transformer.h.0.attn.c_attn.weight": "attention_qkv",
        "transformer.h.0.attn.c_proj.weight": "attention_out",
        "transformer.h.0.mlp.c_fc.weight": "mlp_in",
        "transformer.h.0.mlp.c_proj.weight": "mlp_out",
        "transformer.wte.weight": "embedding",
        "model.embed_tokens.weight": "embedding",
        "layers.0.self_attn.q_proj.weight": "attention_qkv",
        "layers.0.self_attn.o_proj.weight": "attention_out",
        "layers.0.mlp.gate_proj.weight": "mlp_in",
        "layers.0.mlp.down_proj.weight": "mlp_out",
        "encoder.layers.0.self_attn.in_proj_weight": "attention_qkv",
        "encoder.layers.0.linear2.weight": "mlp_out",
        "blocks.0.attn.q.weight": "attention_qkv",
        "blocks.0.attn.out.weight": "attention_out",
        "blocks.0.mlp.0.weight": "mlp_in",  # widening (8 × 4)
        "conv.weight": None,
    }
    for name, label in cases.items():
        assert module_label(name, linear) == label, name
    assert module_label("blocks.0.mlp.2.weight", torch.zeros(4, 8)) == "mlp_out"
    assert module_label("h.0.ln_1.weight", torch.zeros(4)) == "norm_gain"
    assert module_label("h.0.mlp.c_fc.bias", torch.zeros(4)) == "bias"


def test_hetero_puts_attention_on_stiefel_and_the_mlp_on_dgram():
    m = model()
    opt = kappa.optim.modulewise(m.named_parameters(), preset="HETERO")
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"attn_qkv", "attn_out", "mlp_in", "mlp_out", "embedding", "gain_bias"}
    assert [groups[n]["geometry"] for n in ("attn_qkv", "attn_out", "mlp_in", "mlp_out")] == [
        "stiefel", "stiefel", "dgram", "dgram"]
    assert groups["embedding"]["algorithm"] == groups["gain_bias"]["algorithm"] == "adamw"
    assert groups["attn_qkv"]["lr"] == pytest.approx(0.02)
    # The tied embedding is one parameter, listed once.
    assert len(groups["embedding"]["params"]) == 2
    placed = sum(len(g["params"]) for g in opt.param_groups)
    assert placed == len(list(m.parameters()))


@pytest.mark.parametrize("preset", ["HETERO", "HETERO-INV"])
def test_constrained_matrices_stay_on_their_manifolds_as_the_loss_falls(preset):
    m = model(1)
    opt = kappa.optim.modulewise(m.named_parameters(), preset=preset, lr=3e-3)
    first = loss_of(m, 0).item()
    for step in range(40):
        opt.zero_grad()
        loss_of(m, step).backward()
        opt.step()
    last = sum(loss_of(m, 1000 + s).item() for s in range(4)) / 4
    assert last < 0.8 * first
    # f32 Gram matrices of unit-scale rows or columns (n ≤ 64 terms): 8·n·u relative, as in the
    # ManifoldMuon tests; the retraction after each step puts the matrix back within that.
    for g in opt.param_groups:
        if g["algorithm"] != "manifold":
            continue
        for w in g["params"]:
            n = max(w.shape)
            scale = (w.detach() ** 2).sum(dim=int(w.shape[0] < w.shape[1])).max().item()
            assert constraint_gap(w, g["geometry"]) <= 8 * n * 2**-24 * max(scale, 1.0), g["name"]


def test_the_modulewise_state_round_trips_exactly_and_schedulers_drive_every_group():
    def run(resume):
        m = model(2)
        opt = kappa.optim.modulewise(m.named_parameters(), preset="HETERO")
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
        for step in range(4):
            if step == 2 and resume:
                buffer = io.BytesIO()
                torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buffer)
                buffer.seek(0)
                saved = torch.load(buffer)
                # Built before the weights are loaded, as the Rust trainer resumes: building
                # retracts the constrained matrices, which moves one already on its manifold by
                # roundoff.
                m = model(9)
                opt = kappa.optim.modulewise(m.named_parameters(), preset="HETERO")
                m.load_state_dict(saved["model"])
                opt.load_state_dict(saved["opt"])
                sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s, last_epoch=step - 1)
            opt.zero_grad()
            loss_of(m, step).backward()
            opt.step()
            sched.step()
        return m, opt

    (a, opt_a), (b, _) = run(False), run(True)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    for g in opt_a.param_groups:
        assert opt_a._engine.lr(g["name"]) == pytest.approx(g["initial_lr"] * 0.5 ** 3)


def test_unplaced_parameters_and_unknown_presets_raise_value_errors():
    m = model()
    m.extra = nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="extra"):
        kappa.optim.modulewise(m.named_parameters())
    with pytest.raises(ValueError, match="HETERO"):
        kappa.optim.modulewise(model().named_parameters(), preset="hetero-ish")
    with pytest.raises(ValueError, match="muon_lr"):
        kappa.optim.modulewise(model().named_parameters(), muon_lr=-1.0)
    labels = {"extra": "not_a_label"}
    with pytest.raises(ValueError, match="not_a_label"):
        kappa.optim.modulewise(m.named_parameters(), label_of=lambda n, p: labels.get(n) or module_label(n, p))
