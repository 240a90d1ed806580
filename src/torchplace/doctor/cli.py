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
import sys

from torchplace import report
from torchplace.doctor.assemble import collect
from torchplace.doctor.rendering import render

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
