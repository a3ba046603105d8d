"""torch.optim.Muon's orthogonalization without its cast to bfloat16, shared by the reference
scripts of this folder (imported as a module: each script's own folder is on Python's path)."""
import torch


def newton_schulz(grad, ns_coefficients, ns_steps, eps):
    """`torch.optim._muon._zeropower_via_newtonschulz` in the type of `grad` (torch's casts to
    bfloat16): X = G/max(‖G‖_F, eps) in the wide orientation, then per step A = X Xᵀ,
    B = b·A + c·A², X = a·X + B·X (one product and two addmm, as torch's)."""
    a, b, c = ns_coefficients
    x = grad
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def newton_schulz_f32(grad, ns_coefficients, ns_steps, eps):
    """`newton_schulz` in float32, whatever the type of `grad`."""
    return newton_schulz(grad.float(), ns_coefficients, ns_steps, eps)
