"""Attention's weight Jacobian, its condition number, the spectral corrections and the
diagnostics, for one head A(X) = softmax(X W_Q (X W_K)ᵀ / s) X W_V with X ∈ ℝ^{N×D},
W ∈ ℝ^{D×k}.

The functions compute in f64 on copies of their inputs (kappa-attention's exact code) and
return f64 tensors. Vectorization is column-major: ``weight_jacobian``'s row ``i + c*N`` is
output entry ``A[i, c]`` and its column ``d + e*D`` (plus ``D*k`` per block, in the order Q, K,
V) is weight entry ``W[d, e]``.

``ConditionedMultiheadAttention`` is a ``torch.nn.Module`` (torch computes its forward and
backward) whose projections carry a fixed correction, and ``DiagnosticsHook`` reports κ(J),
entropy, saturation and the largest logit of each head during training.
"""

import math
from typing import Dict, List, Optional, Union

import torch
from torch import nn

from . import _kappa

__all__ = [
    "weight_jacobian", "weight_jacobian_blocks", "jvp_weights", "vjp_weights", "theorem_3_4", "svd_correction",
    "identity_shift", "diagnostics", "ConditionedMultiheadAttention", "DiagnosticsHook",
]

Scale = Union[str, float]

SATURATION_THRESHOLD = _kappa.SATURATION_THRESHOLD


def weight_jacobian(x, wq, wk, wv, scale: Scale = "one", causal: bool = False) -> torch.Tensor:
    """J = ∂vec A / ∂[vec W_Q; vec W_K; vec W_V], an (N·k) × (3·D·k) tensor. ``scale``:
    ``"one"`` (s = 1, the paper's form), ``"inv_sqrt_k"`` (s = √k) or a number s."""
    return _kappa.weight_jacobian(x, wq, wk, wv, scale, causal)


def weight_jacobian_blocks(x, wq, wk, wv, scale: Scale = "one", causal: bool = False):
    """(J_Q, J_K, J_V), the blocks of ``weight_jacobian``, each (N·k) × (D·k): for heads whose
    full J exceeds kappa's dense limit of 2²⁸ entries (N = 197, D = 192, k = 64 needs 4.6·10⁸)."""
    return _kappa.weight_jacobian_blocks(x, wq, wk, wv, scale, causal)


def jvp_weights(x, wq, wk, wv, dwq, dwk, dwv, scale: Scale = "one", causal: bool = False) -> torch.Tensor:
    """J·(dW_Q, dW_K, dW_V) as an N×k tensor, without forming J."""
    return _kappa.jvp_weights(x, wq, wk, wv, dwq, dwk, dwv, scale, causal)


def vjp_weights(x, wq, wk, wv, g, scale: Scale = "one", causal: bool = False):
    """Jᵀ·g for an N×k cotangent ``g``, as the triple (dW_Q, dW_K, dW_V), without forming J."""
    return _kappa.vjp_weights(x, wq, wk, wv, g, scale, causal)


def theorem_3_4(x, wq, wk, wv, scale: Scale = "one", causal: bool = False) -> dict:
    """κ(J) of one head next to Theorem 3.4's bound
    rhs = κ(X)³ κ⁺(Λ) κ(W_V) (κ(W_Q) + κ(W_K)) + κ(X) κ(P): a dict with the factors, ``rhs``,
    ``holds``, ``ratio`` (κ(J)/rhs), ``block_rhs`` and ``jacobian`` (the κ of J and of its Q, K,
    V blocks, each with ``kappa``, ``pseudo_kappa``, ``rank``, ``sigma_max``, ``sigma_min``)."""
    return _kappa.theorem_3_4(x, wq, wk, wv, scale, causal)


def svd_correction(w: torch.Tensor) -> torch.Tensor:
    """C = σ_max(W)·U Vᵀ (Theorem 3.5): W + C has singular values σ_i + σ_max, so
    κ(W + C) = 2σ_max / (σ_max + σ_min) < 2. Returned in ``w``'s dtype and device."""
    return _kappa.svd_correction(w).to(dtype=w.dtype, device=w.device)


def identity_shift(d: int, k: int, lam: float, offset: int = 0) -> torch.Tensor:
    """λ·E, the D×k block identity at row ``offset`` times λ (Theorem 3.8's O(Dk) correction):
    W + λE moves each singular value of W by at most λ."""
    return _kappa.identity_shift(d, k, lam, offset)


def diagnostics(p, scores, causal: bool = False, threshold: float = SATURATION_THRESHOLD) -> dict:
    """Entropy (mean, per row, uniform), the largest logit, the fraction of saturated rows (top
    probability above ``threshold``), the mean diagonal and the mean ‖Λ_i‖_F of one head's
    probabilities ``p`` and ``scores`` (both N×N)."""
    return _kappa.diagnostics(p, scores, causal, threshold)


class ConditionedMultiheadAttention(nn.Module):
    """Multi-head self-attention whose Q, K and V projections carry a fixed spectral
    correction: head h uses W^h + C^h, where W^h (D×k) is trained and C^h is fixed.

    ``correction``: ``None`` (plain attention), ``"identity"`` (C^h = λ·E at row offset h·k, so
    the whole projection is W + λ·I when H·k = D; ``lam`` in units of the initial σ_max of each
    projection when ``relative=True``), or ``"svd"`` (C^h = σ_max U Vᵀ of the initial W^h,
    Theorem 3.5). ``scale`` is ``"inv_sqrt_k"`` (the transformer's s = √k, default) or
    ``"one"``. Input and output are (B, N, D) with ``batch_first`` layout.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        correction: Optional[str] = "identity",
        lam: float = 1.0,
        relative: bool = False,
        scale: Scale = "inv_sqrt_k",
        causal: bool = False,
        bias: bool = False,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}")
        if correction not in (None, "identity", "svd"):
            raise ValueError(f"unknown correction `{correction}` (one of: None, identity, svd)")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.scale, self.causal, self.correction = scale, causal, correction
        self.q = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out = nn.Linear(embed_dim, embed_dim, bias=bias)
        for name in ("q", "k", "v"):
            self.register_buffer(f"c_{name}", self._correction(getattr(self, name).weight, lam, relative))

    def _correction(self, weight: torch.Tensor, lam: float, relative: bool) -> torch.Tensor:
        """The fixed correction of one projection in nn.Linear's (out, in) layout."""
        d, k, heads = self.embed_dim, self.head_dim, self.num_heads
        blocks = []
        with torch.no_grad():
            for h in range(heads):
                w_h = weight[h * k:(h + 1) * k, :].T  # D×k, kappa's layout
                if self.correction == "svd":
                    c = svd_correction(w_h)
                elif self.correction == "identity":
                    sigma = torch.linalg.matrix_norm(w_h.double(), ord=2).item() if relative else 1.0
                    c = identity_shift(d, k, lam * sigma, offset=h * k)
                else:
                    c = torch.zeros(d, k, dtype=torch.float64)
                blocks.append(c.T.to(weight.dtype))
        return torch.cat(blocks, dim=0)

    def head_weights(self, h: int) -> List[torch.Tensor]:
        """Head h's effective (W + C) for Q, K, V, each D×k (kappa's layout), detached."""
        k = self.head_dim
        out = []
        for name in ("q", "k", "v"):
            w = getattr(self, name).weight + getattr(self, f"c_{name}")
            out.append(w[h * k:(h + 1) * k, :].T.detach())
        return out

    def _divisor(self) -> float:
        if self.scale == "one":
            return 1.0
        if self.scale == "inv_sqrt_k":
            return math.sqrt(self.head_dim)
        return float(self.scale)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """The (B, H, N, N) scores X W_Q (X W_K)ᵀ / s (masked with -inf when causal)."""
        b, n, _ = x.shape
        q = nn.functional.linear(x, self.q.weight + self.c_q, self.q.bias)
        k = nn.functional.linear(x, self.k.weight + self.c_k, self.k.bias)
        q = q.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        s = q @ k.transpose(-1, -2) / self._divisor()
        if self.causal:
            mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
        return s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        p = torch.softmax(self.scores(x), dim=-1)
        v = nn.functional.linear(x, self.v.weight + self.c_v, self.v.bias)
        v = v.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        return self.out((p @ v).transpose(1, 2).reshape(b, n, d))


class DiagnosticsHook:
    """Records the input of every ``ConditionedMultiheadAttention`` in ``model`` on every
    ``every``-th forward pass (the first sequence of the batch), and reports per head: κ(J) and
    κ⁺(J) (over the nonzero singular values; a causal head's J is rank-deficient, so its κ is
    ∞) of the weight Jacobian (when ``jacobian=True``; it costs SVDs of an (N·k) × (3·D·k)
    matrix, so keep N small with ``max_tokens``), the mean entropy, the saturated fraction and
    the largest logit.

    Usage::

        hook = kappa.attention.DiagnosticsHook(model, every=100)
        ...  # train
        for name, heads in hook.report().items(): print(name, heads[0]["max_logit"])
        hook.remove()
    """

    def __init__(self, model: nn.Module, every: int = 100, jacobian: bool = True, max_tokens: int = 32) -> None:
        if every < 1:
            raise ValueError(f"every must be ≥ 1, got {every}")
        self.every, self.jacobian, self.max_tokens = every, jacobian, max_tokens
        self.calls = 0
        self.inputs: Dict[str, torch.Tensor] = {}
        self.modules = {n: m for n, m in model.named_modules() if isinstance(m, ConditionedMultiheadAttention)}
        if not self.modules:
            raise ValueError("the model has no ConditionedMultiheadAttention module")
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in self.modules.items()]

    def _hook(self, name: str):
        def record(module, args, output):
            if name == next(iter(self.modules)):
                self.calls += 1
            if (self.calls - 1) % self.every == 0:
                self.inputs[name] = args[0][0, : self.max_tokens].detach().clone()
        return record

    def report(self) -> Dict[str, List[dict]]:
        """Per recorded module, one dict per head (see the class docs)."""
        out = {}
        for name, x in self.inputs.items():
            m = self.modules[name]
            with torch.no_grad():
                s = m.scores(x.unsqueeze(0))[0]
            heads = []
            for h in range(m.num_heads):
                p = torch.softmax(s[h], dim=-1)
                finite = torch.where(torch.isfinite(s[h]), s[h], torch.zeros_like(s[h]))
                d = diagnostics(p, finite, causal=m.causal)
                row = {k: d[k] for k in ("mean_entropy", "uniform_entropy", "saturated_fraction", "max_logit")}
                if self.jacobian:
                    wq, wk, wv = m.head_weights(h)
                    t = theorem_3_4(x, wq, wk, wv, scale=m.scale, causal=m.causal)
                    row["kappa_j"] = t["jacobian"]["full"]["kappa"]
                    row["pseudo_kappa_j"] = t["jacobian"]["full"]["pseudo_kappa"]
                heads.append(row)
            out[name] = heads
        return out

    def remove(self) -> None:
        """Removes the hooks."""
        for handle in self.handles:
            handle.remove()
