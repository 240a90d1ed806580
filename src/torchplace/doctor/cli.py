"""Check that torch really runs on a device, and report what is visible.

``torchplace doctor`` reports the torch build (CPU-only, CUDA or ROCm, with compiled CUDA, cuDNN,
HIP and MIOpen versions), the driver (through NVML when ``nvidia-ml-py`` is installed), every
visible device with the physical GPU it maps to under ``CUDA_VISIBLE_DEVICES``, its memory and
compute capability against the build's arch list, and then runs smoke tests on the chosen device:
a host -> device -> host round trip from pinned memory with ``non_blocking=True``, and a matmul
compared with a float64 CPU reference. Each problem comes with a verdict and a fix.

Exit status: 0 when the requested device is usable, 1 when it is not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys

from torchplace import report
from torchplace.doctor.assemble import collect
from torchplace.doctor.rendering import render
from torchplace.errors import TorchplaceError

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare ``torchplace doctor``'s options."""
    parser.add_argument(
        "--device",
        default="auto",
        metavar="SPEC",
        help="device to check: auto (default; $TORCHPLACE_DEVICE, else first accelerator, else "
        "cpu), cpu, cuda, cuda:N, N, mps, xpu, meta",
    )
    parser.add_argument(
        "--no-smoke",
        dest="smoke",
        action="store_false",
        help="skip the round-trip and matmul smoke tests",
    )
    report.add_output_options(parser)


def run(args: argparse.Namespace) -> int:
    """Run the doctor; 0 when the requested device is usable, 1 when it is not."""
    report.check_output(args.output)
    _require_torch()
    result = collect(args.device, smoke=args.smoke)
    verdict = result["verdict"]
    if args.format == "json":
        document = report.envelope("doctor", result, device=verdict["device"])
        report.write_report(report.to_json(document), args.output)
    else:
        with report.open_report(args.output) as out:
            render(result, file=out)
    if verdict["usable"]:
        return report.EXIT_OK
    if args.format == "json" or args.output is not None:
        # tables on stdout already end with the verdict and its fixes; elsewhere, say it here
        print(f"torchplace doctor: {verdict['summary']}", file=sys.stderr)
        for fix in verdict["fixes"]:
            print(f"  fix: {fix}", file=sys.stderr)
    return report.EXIT_FAILED


def _require_torch() -> None:
    """Import torch, or say why it cannot be: a broken install, or an environment variable
    torch reads on import (``TORCH_LOGS=bogus``) making ``import torch`` itself fail."""
    try:
        import torch  # noqa: F401
    except Exception as exc:
        text = " ".join(str(exc).split())
        first = text.split(". ", 1)[0].rstrip(".")  # its first sentence: torch's can be long
        why = f"{type(exc).__name__}: {first[:300]}".rstrip(": ")
        suspects = sorted(
            f"{name}={value}"
            for name, value in os.environ.items()
            if name.startswith(("TORCH_", "PYTORCH_"))
        )
        if suspects:
            fix = (
                "check the environment variables torch reads on import, or unset them: "
                + ", ".join(suspects)
            )
        else:
            fix = "reinstall torch (pip install --force-reinstall torch) in this environment"
        raise TorchplaceError(f"torch cannot be imported ({why}). Fix: {fix}") from None
