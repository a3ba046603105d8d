"""kappa for PyTorch: Muon and manifold Muon optimizers, spectral linear algebra and
attention-conditioning diagnostics, running on the torch tensors you already have.

The package is a thin layer over kappa's Rust crates (kappa-optim, kappa-linalg,
kappa-attention). Its extension shares the process's libtorch with ``torch``: a tensor passed
to kappa is the same tensor (same storage, same ``.grad``), never a copy.
"""

from importlib import metadata as _metadata

import torch  # first: the extension links the libtorch this import loads


def _check_torch() -> None:
    """Refuses a torch other than the one the extension was built against."""
    try:
        pins = [r for r in (_metadata.requires("kappa") or []) if r.startswith("torch==")]
    except _metadata.PackageNotFoundError:
        return
    wanted = pins[0].split("==", 1)[1] if pins else None
    running = torch.__version__.split("+", 1)[0]
    if wanted is not None and running != wanted:
        raise ImportError(
            f"kappa was built against torch {wanted} and this process runs torch {running}; "
            f"install torch=={wanted} or rebuild kappa against this torch "
            "(see the Python section of kappa's docs)"
        )


_check_torch()

from . import _kappa  # noqa: E402
from . import attention, linalg, optim  # noqa: E402

__version__ = _kappa.__version__
__all__ = ["attention", "linalg", "optim", "__version__"]
