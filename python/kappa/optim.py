"""kappa's optimizers as ``torch.optim.Optimizer`` subclasses.

Each class is kappa-optim's Rust ``Optimizer`` underneath (one implementation, shared with the
Rust crates): the parameter groups of ``param_groups`` become its groups, a step runs in Rust on
the parameters' own storage, and ``state_dict`` / ``load_state_dict`` round-trip its state
exactly. Learning rates are read from ``param_groups`` at every step, so torch's lr schedulers
work unchanged; every other setting is fixed when the optimizer is built (changing one later
raises ``ValueError`` at the next step).

A parameter group may name its own algorithm with ``"algorithm": "muon" | "manifold" |
"adamw"``, so one optimizer can run Muon on the hidden matrices and AdamW on the rest
(``muon_adamw`` builds exactly that from a model's parameter names).
"""

import copy
import json
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

from . import _kappa

__all__ = ["Muon", "ManifoldMuon", "AdamW", "Modulewise", "muon_adamw", "modulewise", "module_label", "matrix_spec"]

# Settings that are not part of an algorithm's config.
_GROUP_KEYS = ("params", "param_names", "lr", "initial_lr", "algorithm", "matrix", "batch")

# Keys torch's lr schedulers keep in a group for their own bookkeeping (``OneCycleLR`` and
# ``CyclicLR`` write them): never a setting of the optimizer.
_SCHEDULER_KEYS = ("initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum")

# Keys of a group that are not fixed when the optimizer is built.
_UNFROZEN = ("params", "param_names", "lr") + _SCHEDULER_KEYS

# torch.optim.Muon's `adjust_lr_fn` names and kappa's `UpdateScale` forms.
_SCALES = {None: "original", "original": "original", "match_rms_adamw": "match_rms_adamw", "none": "none"}


def matrix_spec(
    dims: Union[str, Dict[str, List[int]], None] = None,
    split: Optional[Tuple[str, List[int]]] = None,
    heads: Optional[Tuple[str, int]] = None,
) -> Optional[dict]:
    """How Muon and manifold Muon cut each parameter of a group into matrices.

    ``dims``: ``"flatten"`` (dimensions after the first are flattened into columns, as torch
    flattens conv kernels) or ``{"batch": [...], "rows": [...], "cols": [...]}`` (explicit
    dimension numbers: a stack of experts ``[E, m, n]`` is ``{"batch": [0], "rows": [1],
    "cols": [2]}``). ``split=("rows", [768, 768, 768])`` orthogonalizes each block of a fused
    QKV weight separately; ``heads=("rows", 12)`` each head. ``None`` for all three: the
    matrix itself.
    """
    if dims is None and split is None and heads is None:
        return None
    spec: Dict[str, Any] = {}
    if dims is None or dims == "flatten":
        spec["dims"] = "flatten"
    else:
        spec["dims"] = {"explicit": {k: list(dims[k]) for k in ("batch", "rows", "cols")}}
    if split is not None:
        spec["split"] = {"axis": split[0], "sizes": list(split[1])}
    if heads is not None:
        spec["heads"] = {"axis": heads[0], "count": int(heads[1])}
    return spec


def _msign(method: Union[str, dict]) -> Any:
    return method if isinstance(method, dict) else json.loads(_kappa.msign_config(method))


def _merge(base: dict, overrides: Optional[dict]) -> dict:
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _muon_update(group: dict) -> dict:
    config = json.loads(_kappa.muon_config("torch"))
    config.update(
        lr=group["lr"],
        weight_decay=group["weight_decay"],
        momentum={"beta": group["momentum"], "kind": "ema", "nesterov": group["nesterov"]},
        msign=_msign(group["msign"]),
        scale=_SCALES.get(group["adjust_lr_fn"], group["adjust_lr_fn"]),
        precision=group["precision"],
        cautious_weight_decay=group["cautious_weight_decay"],
    )
    normuon = group["normuon"]
    if normuon:
        config["normuon"] = {"beta2": 0.95} if normuon is True else dict(normuon)
    return {"muon": _merge(config, group.get("config"))}


def _manifold_update(group: dict) -> dict:
    config = json.loads(_kappa.manifold_config(group["manifold"], group["solver"]))
    config.update(
        lr=group["lr"],
        momentum={"beta": group["momentum"], "kind": "sgd", "nesterov": group["nesterov"]},
        msign=_msign(group["msign"]),
        precision=group["precision"],
        diagnostics=False,
    )
    return {"manifold": _merge(config, group.get("config"))}


def _adamw_update(group: dict) -> dict:
    beta1, beta2 = group["betas"]
    config = {"beta1": beta1, "beta2": beta2, "eps": group["eps"], "weight_decay": group["weight_decay"]}
    return {"adamw": config}


_UPDATES = {"muon": _muon_update, "manifold": _manifold_update, "adamw": _adamw_update}

# Each algorithm's defaults (its class's), filled into a group that names another algorithm than
# its optimizer's before the optimizer's own defaults apply.
_DEFAULTS = {
    "muon": dict(
        lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, msign="torch_muon", adjust_lr_fn=None,
        precision="auto", normuon=None, cautious_weight_decay=False,
    ),
    "manifold": dict(
        lr=0.02, manifold="stiefel", solver="ascent", momentum=0.95, nesterov=True, msign="polar_express", precision="auto",
    ),
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
}


class _KappaOptimizer(torch.optim.Optimizer):
    """The machinery shared by kappa's optimizers: kappa-optim's Rust optimizer over
    ``param_groups`` (see the module docs)."""

    _algorithm = "muon"

    def __init__(self, params: Iterable, defaults: dict) -> None:
        defaults = dict(defaults, algorithm=self._algorithm, matrix=None, batch=None)
        self._clipped = None
        super().__init__(params, defaults)
        self._engine = self._build()

    def _group_settings(self, group: dict) -> dict:
        algorithm = group["algorithm"]
        if algorithm not in _UPDATES:
            raise ValueError(f"unknown algorithm `{algorithm}` (one of: {', '.join(_UPDATES)})")
        for key, value in _DEFAULTS[algorithm].items():
            group.setdefault(key, value)
        return _settings(group)

    def _build(self):
        specs, tensors, index = [], [], 0
        self._frozen = []
        self._names = [f"group{i}" for i in range(len(self.param_groups))]
        self._keys = []  # the engine's name of each parameter, in param_groups order
        for i, group in enumerate(self.param_groups):
            settings = self._group_settings(group)
            self._frozen.append(copy.deepcopy(settings))
            names = [str(index + j) for j in range(len(group["params"]))]
            index += len(names)
            self._keys.extend(names)
            specs.append({
                "name": self._names[i],
                "update": _UPDATES[group["algorithm"]](group),
                "lr": float(group["lr"]),
                "matrix": group["matrix"],
                "batch": group["batch"],
                "names": names,
            })
            tensors.append(list(group["params"]))
        return _kappa.Optimizer(json.dumps(specs), tensors)

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_engine", None) is not None:
            raise ValueError(
                "kappa's optimizers fix their groups when built: create a new optimizer with "
                "every group (and load the old one's state_dict into it where the groups match)"
            )
        # A group of another algorithm than the optimizer's takes that algorithm's defaults
        # (AdamW's lr and weight decay in a Muon optimizer), not the optimizer's.
        algorithm = param_group.get("algorithm") if isinstance(param_group, dict) else None
        if algorithm in _DEFAULTS and algorithm != self.defaults.get("algorithm", algorithm):
            param_group = dict(param_group)
            for key, value in _DEFAULTS[algorithm].items():
                param_group.setdefault(key, value)
        super().add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's ``zero_grad``; the next step checks the new gradients' entries again."""
        super().zero_grad(set_to_none)
        self._clipped = None
        if getattr(self, "_engine", None) is not None:
            self._engine.recheck_gradients()

    def _grad_versions(self) -> list:
        return [
            None if p.grad is None else (p.grad.data_ptr(), p.grad._version)
            for group in self.param_groups for p in group["params"]
        ]

    def _sync(self) -> None:
        for i, group in enumerate(self.param_groups):
            changed = _changed(_settings(group), self._frozen[i])
            if changed:
                hint = ""
                if "momentum" in changed or "betas" in changed:
                    hint = " (OneCycleLR and CyclicLR change momentum unless given cycle_momentum=False)"
                raise ValueError(
                    f"param_groups[{i}]: {', '.join(changed)} changed after the optimizer was built; "
                    f"only `lr` may change between steps{hint}"
                )
            try:
                lr = float(group["lr"])
            except (TypeError, ValueError) as e:
                raise ValueError(f"param_groups[{i}]: lr {group['lr']!r} is not a number") from e
            self._engine.set_lr(self._names[i], lr)

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every group; ``closure`` (re-evaluating the loss) as in torch."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync()
        if self._clipped is not None and self._clipped != self._grad_versions():
            self._engine.recheck_gradients()
        self._clipped = None
        self._engine.step()
        return loss

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scales all gradients so their global 2-norm is at most ``max_norm`` (``max_norm`` ≤ 0
        scales nothing); returns the norm before scaling (and lets the next step skip its own
        finiteness pass, unless a gradient changes in between)."""
        norm = self._engine.clip_grad_norm(float(max_norm))
        self._clipped = self._grad_versions()
        return norm

    @property
    def steps(self) -> int:
        """Steps taken."""
        return self._engine.steps

    def state_dict(self) -> dict:
        """``{"state": {index: {key: tensor}}, "param_groups": [...], "kappa": {...}}`` in torch's
        layout: ``state[i]`` holds parameter i's buffers (``momentum/<block>``, ``exp_avg``,
        ``exp_avg_sq``, ``second/<block>``, ``steps``), ``param_groups`` the groups' settings with
        parameter indices; ``kappa`` the optimizer-wide entries (the step count)."""
        state: Dict[int, Dict[str, torch.Tensor]] = {}
        extra: Dict[str, torch.Tensor] = {}
        index_of = {k: i for i, k in enumerate(self._keys)}
        for key, tensor in self._engine.state_dict():
            if key.startswith("state/"):
                name, rest = _owner(key[len("state/"):], index_of)
                state.setdefault(index_of[name], {})[rest] = tensor
            elif not key.startswith("lr/"):
                extra[key] = tensor
        groups, index = [], 0
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(saved)
        return {"state": state, "param_groups": groups, "kappa": extra}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a ``state_dict()``; every entry is checked before anything changes (a missing,
        extra or mis-shaped buffer raises ``ValueError`` naming it, and so does a group whose
        saved settings other than ``lr`` differ from this optimizer's: they are fixed when the
        optimizer is built, so build it with the saved run's settings)."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state has {len(groups)} parameter groups, the optimizer {len(self.param_groups)}")
        for i, (saved, group) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"param_groups[{i}] has {len(group['params'])} parameters, the state's {len(saved['params'])}"
                )
            changed = _changed(_settings(saved), self._frozen[i])
            if changed:
                raise ValueError(
                    f"param_groups[{i}]: the state's {', '.join(changed)} differ from this optimizer's; "
                    "build the optimizer with the saved settings"
                )
        flat: Dict[str, torch.Tensor] = dict(state_dict.get("kappa", {}))
        for index, buffers in state_dict["state"].items():
            if not 0 <= int(index) < len(self._keys):
                raise ValueError(f"the state has buffers of parameter {index}; the optimizer has {len(self._keys)}")
            for key, tensor in buffers.items():
                flat[f"state/{self._keys[int(index)]}/{key}"] = tensor
        for name, saved in zip(self._names, groups):
            flat[f"lr/{name}"] = torch.tensor([float(saved["lr"])], dtype=torch.float64)
        self._engine.load_state_dict(flat)
        for saved, group in zip(groups, self.param_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self._clipped = None


def _owner(key: str, names: dict) -> Tuple[str, str]:
    """(parameter name, buffer) of an engine state key ``<name>/<buffer>``: the longest prefix
    that names a parameter, since a parameter name may itself hold ``/``."""
    parts = key.split("/")
    for j in range(len(parts) - 1, 0, -1):
        name = "/".join(parts[:j])
        if name in names:
            return name, "/".join(parts[j:])
    raise ValueError(f"the optimizer's state key `{key}` names no parameter")


def _settings(group: dict) -> dict:
    """The settings of a group that are fixed when the optimizer is built."""
    return {k: v for k, v in group.items() if k not in _UNFROZEN}


def _changed(settings: dict, frozen: dict) -> list:
    """The keys whose values differ between two groups' fixed settings (tuples and lists of the
    same values are equal: a state saved with ``torch.save`` may turn one into the other)."""
    def norm(v):
        return list(v) if isinstance(v, tuple) else v
    keys = set(settings) | set(frozen)
    return sorted(k for k in keys if norm(settings.get(k)) != norm(frozen.get(k)))


class Muon(_KappaOptimizer):
    r"""Muon: momentum, then each matrix's update replaced by its orthogonal polar factor.

    The defaults and arguments are ``torch.optim.Muon``'s (lr 1e-3, weight decay 0.1, momentum
    0.95 with Nesterov, the quintic Newton–Schulz ``msign="torch_muon"``, ``adjust_lr_fn``),
    and a step is the same algorithm to roundoff. Beyond it:

    * ``msign``: any kappa orthogonalizer (``"polar_express"``, ``"gram_polar_express"``,
      ``"aol"``, ``"exact"``, … or a dict, see ``kappa.linalg.msign``);
    * ``precision``: ``"auto"`` (bf16 where that is faster, else f32), ``"f32"``, ``"bf16"``,
      ``"native"`` (torch.optim.Muon always runs bf16);
    * ``normuon``: NorMuon's per-neuron normalization (``True`` or ``{"beta2": …, "axis":
      "outputs" | "long_side"}``); ``cautious_weight_decay``;
    * ``matrix``: per-head, per-block or N-D handling (``kappa.optim.matrix_spec``);
    * ``config``: any field of kappa-optim's ``MuonConfig``, as a dict, over the above.

    Parameters must be matrices (or tensors a ``matrix`` spec cuts into matrices); put
    embeddings, heads, gains and biases in an ``"algorithm": "adamw"`` group, or use
    ``muon_adamw``.
    """

    _algorithm = "muon"

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        msign: Union[str, dict] = "torch_muon",
        adjust_lr_fn: Optional[str] = None,
        precision: str = "auto",
        normuon: Union[bool, dict, None] = None,
        cautious_weight_decay: bool = False,
        config: Optional[dict] = None,
    ) -> None:
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, msign=msign,
            adjust_lr_fn=adjust_lr_fn, precision=precision, normuon=normuon,
            cautious_weight_decay=cautious_weight_decay, config=config,
        )
        super().__init__(params, defaults)


class ManifoldMuon(_KappaOptimizer):
    r"""Manifold Muon: the steepest descent step in the spectral norm that stays on a manifold
    (``"stiefel"``: WᵀW = I; ``"dgram"``: orthogonal columns of free norms; ``"oblique"``: unit
    columns), found by dual ascent (``solver="ascent"``, the default) or ADMM (``"admm"``;
    ``config={"solver": {"admm": {"rho": 1.0}}}`` edits its settings), then retracted.

    Each parameter is retracted onto its manifold when the optimizer is built. ``config`` takes
    any field of kappa-optim's ``ManifoldMuonConfig``. Defaults: the manifold Muon paper's
    (lr 0.02, SGD-Nesterov momentum 0.95, 20 dual-ascent steps, Polar Express msign).
    """

    _algorithm = "manifold"

    def __init__(
        self,
        params: Iterable,
        lr: float = 0.02,
        manifold: str = "stiefel",
        solver: str = "ascent",
        momentum: float = 0.95,
        nesterov: bool = True,
        msign: Union[str, dict] = "polar_express",
        precision: str = "auto",
        config: Optional[dict] = None,
    ) -> None:
        defaults = dict(
            lr=lr, manifold=manifold, solver=solver, momentum=momentum, nesterov=nesterov,
            msign=msign, precision=precision, config=config,
        )
        super().__init__(params, defaults)


class AdamW(_KappaOptimizer):
    """kappa's AdamW (``torch.optim.AdamW``'s algorithm and defaults), mainly as the default
    algorithm of groups in a mixed optimizer."""

    _algorithm = "adamw"

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))


def muon_adamw(
    named_parameters: Iterable[Tuple[str, torch.Tensor]],
    lr: float = 0.02,
    adamw_lr: float = 3e-4,
    weight_decay: float = 0.0,
    adamw_betas: Tuple[float, float] = (0.9, 0.95),
    adamw_weight_decay: float = 0.0,
    **muon: Any,
) -> Muon:
    """Muon on the hidden matrices, AdamW on the rest, placed by kappa's rules (those of the
    Rust ``Grouping::muon_adamw``): embeddings, positional tables and output heads (names
    matching ``*wte*``, ``*wpe*``, ``*embed*``, ``*lm_head*``, ``head.*``, ``*classifier*``, …)
    and every parameter of rank < 2 go to AdamW (gains and biases without weight decay), every
    other parameter to Muon. ``muon`` passes further ``Muon`` arguments.

    Usage: ``opt = kappa.optim.muon_adamw(model.named_parameters(), lr=0.02)``.
    """
    named = [(n, p) for n, p in named_parameters if p.requires_grad]
    placed = dict(_kappa.muon_adamw_groups(named))
    tensors = dict(named)
    groups = []
    for name, algorithm, decay in (("muon", "muon", weight_decay), ("adamw", "adamw", adamw_weight_decay),
                                   ("adamw_no_decay", "adamw", 0.0)):
        params = [tensors[n] for n in placed.get(name, [])]
        if not params:
            continue
        group = {"params": params, "algorithm": algorithm, "weight_decay": decay}
        if algorithm == "adamw":
            group.update(lr=adamw_lr, betas=adamw_betas)
        groups.append(group)
    return Muon(groups, lr=lr, weight_decay=weight_decay, **muon)


# Parameter-name components of common PyTorch models, by module label (kappa's and nanoGPT's GPT
# names are read by kappa-train's own labelling first).
_LABEL_PARTS = {
    "attention_qkv": ("c_attn", "qkv", "Wqkv", "query_key_value", "q_proj", "k_proj", "v_proj",
                      "query", "key", "value", "wq", "wk", "wv"),
    "attention_out": ("out_proj", "o_proj", "wo"),
    "mlp_in": ("c_fc", "fc1", "fc_in", "up_proj", "gate_proj", "w1", "w3", "linear1"),
    "mlp_out": ("fc2", "fc_out", "down_proj", "w2", "linear2"),
}
_ATTENTION_PARENTS = ("attn", "attention", "self_attn", "self_attention")
_ATTENTION_CHILDREN = {"q": "attention_qkv", "k": "attention_qkv", "v": "attention_qkv",
                       "out": "attention_out", "proj": "attention_out", "c_proj": "attention_out",
                       "dense": "attention_out"}
_MLP_PARENTS = ("mlp", "ffn", "feed_forward", "feedforward")
_EMBEDDING_PARTS = ("wte", "wpe", "lm_head", "tok_embeddings")


def module_label(name: str, param: torch.Tensor) -> Optional[str]:
    """The module label of a parameter from its name: ``"attention_qkv"``, ``"attention_out"``,
    ``"mlp_in"``, ``"mlp_out"``, ``"embedding"``, ``"norm_gain"`` or ``"bias"``; ``None`` when
    the name says nothing. In order:

    1. kappa's and nanoGPT's GPT names (``h.0.attn.c_attn.weight``,
       ``transformer.h.0.mlp.c_proj.weight``), read as kappa-train reads them;
    2. a parameter of rank < 2: ``bias`` when its name ends so, else ``norm_gain``;
    3. ``wte``, ``wpe``, ``lm_head``, ``tok_embeddings`` or a component containing ``embed``:
       ``embedding``;
    4. the module's own name: ``in_proj_weight``, ``q_proj``, ``k_proj``, ``v_proj``, ``qkv``,
       ``query``/``key``/``value``, … (attention input); ``out_proj``, ``o_proj`` (attention
       output); ``fc1``, ``up_proj``, ``gate_proj``, ``linear1``, … (MLP input); ``fc2``,
       ``down_proj``, ``linear2``, … (MLP output);
    5. a child ``q``, ``k``, ``v`` / ``out``, ``proj``, ``dense`` of a module named ``attn``,
       ``attention``, ``self_attn``: attention input / output;
    6. any weight under a module named ``mlp``, ``ffn`` or ``feed_forward`` (an
       ``nn.Sequential``'s ``mlp.0.weight``): ``mlp_in`` when it widens (more rows than
       columns), else ``mlp_out``.
    """
    label = _kappa.module_label(name)
    if label is not None:
        return label
    parts = name.split(".")
    if param.dim() < 2:
        return "bias" if parts[-1].endswith("bias") else "norm_gain"
    if any(p in _EMBEDDING_PARTS or "embed" in p for p in parts):
        return "embedding"
    if parts[-1] == "in_proj_weight":
        return "attention_qkv"
    module = parts[-2] if len(parts) > 1 else ""
    parent = parts[-3] if len(parts) > 2 else ""
    for label, names in _LABEL_PARTS.items():
        if module in names:
            return label
    if parent in _ATTENTION_PARENTS and module in _ATTENTION_CHILDREN:
        return _ATTENTION_CHILDREN[module]
    if parent in _MLP_PARENTS or module in _MLP_PARENTS:
        return "mlp_in" if param.shape[0] > param.shape[1] else "mlp_out"
    return None


class Modulewise(_KappaOptimizer):
    r"""A different optimizer per module, after *Different Layers, Different Manifolds*: the
    attention and MLP matrices each on Muon or manifold Muon (Stiefel, DGram, Oblique), the
    embeddings on AdamW with weight decay, gains and biases on AdamW without. The groups are
    kappa-train's ``modulewise_groups`` (the Rust trainer's, so Python and Rust runs of a preset
    are the same optimizer). Build it with ``kappa.optim.modulewise``.

    ``param_groups`` has one group per module label (``attn_qkv``, ``attn_out``, ``mlp_in``,
    ``mlp_out``, ``embedding``, ``gain_bias``), each with its ``name``, ``algorithm``,
    ``geometry`` and peak ``lr``; torch's lr schedulers scale each group's rate as in the
    paper, where the Muon rate follows the AdamW schedule's factor.
    """

    def __init__(self, named: List[Tuple[str, torch.Tensor]], labels: List[str], config: dict,
                 adamw: Tuple[float, float, float, float, float]) -> None:
        engine, infos = _kappa.modulewise_optimizer(named, labels, json.dumps(config), adamw)
        tensors = dict(named)
        groups = [
            {"params": [tensors[n] for n in names], "lr": lr, "name": name, "algorithm": algorithm,
             "geometry": geometry}
            for name, algorithm, geometry, lr, names in infos
        ]
        self._prepared, self._infos = (engine, [info[0] for info in infos]), infos
        self._clipped = None
        torch.optim.Optimizer.__init__(self, groups, {})
        self._engine = self._build()

    def _group_settings(self, group: dict) -> dict:
        return _settings(group)

    def _build(self):
        engine, self._names = self._prepared
        self._keys = [name for _, _, _, _, names in self._infos for name in names]
        self._frozen = [copy.deepcopy(_settings(g)) for g in self.param_groups]
        return engine


def modulewise(
    named_parameters: Iterable[Tuple[str, torch.Tensor]],
    preset: str = "HETERO",
    lr: float = 6e-4,
    muon_lr: float = 0.02,
    betas: Tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    label_of: Optional[Any] = None,
    config: Optional[dict] = None,
) -> Modulewise:
    """The manifold paper's module-wise optimizer for a transformer's parameters.

    ``preset``: ``"UNCONSTRAINED"`` (Muon everywhere), ``"ALL-STIEFEL"``, ``"ALL-DGRAM"``,
    ``"HETERO"`` (Stiefel attention, DGram MLP: the paper's best), ``"HETERO-INV"``. The
    settings are the paper's (kappa-train's ``ModulewiseConfig::paper``: Muon lr 0.02, Polar
    Express, SGD-Nesterov momentum 0.95, 20 dual-ascent steps, embedding weight decay 0.1);
    ``muon_lr`` sets the Muon and manifold-Muon peak rate, ``config`` overrides any field of
    ``ModulewiseConfig`` as a dict (e.g. ``{"assignment": {"split_qkv": True}}``). ``lr``,
    ``betas``, ``eps`` and ``weight_decay`` are AdamW's (the embeddings take the config's
    ``embedding_weight_decay``). ``label_of(name, param)`` places each parameter (default
    ``module_label``); a parameter it cannot place raises ``ValueError`` naming it.

    Building the optimizer retracts every constrained matrix onto its manifold. To resume a run
    exactly, build it first, then load the model's weights and the optimizer's ``state_dict``
    (a matrix already on its manifold moves by roundoff when retracted again).

    Usage: ``opt = kappa.optim.modulewise(model.named_parameters(), preset="HETERO")``.
    """
    named = [(n, p) for n, p in named_parameters if p.requires_grad]
    label_of = label_of or module_label
    labels = [label_of(n, p) for n, p in named]
    unplaced = [n for (n, _), label in zip(named, labels) if label is None]
    if unplaced:
        raise ValueError(
            f"no module label for {len(unplaced)} parameter(s): {', '.join(unplaced)}; "
            "pass label_of=(name, param) -> label"
        )
    settings = json.loads(_kappa.modulewise_config(preset))
    settings["muon_lr"] = muon_lr
    _merge(settings, config)
    return Modulewise(named, labels, settings, (lr, betas[0], betas[1], eps, weight_decay))
