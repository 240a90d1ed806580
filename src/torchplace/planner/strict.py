"""The checks the CPU and CUDA kernels make that ``meta``'s skip.

``meta``'s matrix products and convolutions take operands of different dtypes, where every
real kernel refuses them ("mat1 and mat2 must have the same dtype"): a timestep declared
``INT64`` reaching a ``Linear`` (HunyuanDiT's) was planned, and fit, on ``meta``, and only
``--verify``'s run failed. The recorder makes the check before it runs such an operator on
``meta``, so that the forward fails where it would with data.
"""

from __future__ import annotations

from typing import Any

__all__ = ["refuse_mixed_dtypes"]

#: operators whose real kernels take operands of one dtype, which ``meta``'s do not check
#: (``bmm`` and ``baddbmm``'s do)
_ONE_DTYPE = frozenset({"mm", "addmm", "mv", "addmv", "convolution", "_convolution"})


def refuse_mixed_dtypes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise, as the real kernels do, where ``func`` is given operands of different dtypes."""
    import torch

    if func._overloadpacket.__name__ not in _ONE_DTYPE:
        return
    operands = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    dtypes = list(dict.fromkeys(str(t.dtype).removeprefix("torch.") for t in operands))
    if len(dtypes) > 1:
        raise RuntimeError(
            f"operands of different dtypes ({', '.join(dtypes)}), which the CPU and CUDA "
            "kernels refuse"
        )
