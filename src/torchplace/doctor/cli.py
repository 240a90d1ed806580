"""Check that torch really runs on a device, and report what is visible.

``torchplace doctor`` reports the torch build (CPU-only, CUDA or ROCm, with compiled CUDA, cuDNN,
HIP and MIOpen versions), the driver (through NVML when ``nvidia-ml-py`` is installed), every
visible device with the physical GPU it maps to under ``CUDA_VISIBLE_DEVICES``, its memory and
compute capability against the build's arch list, and then runs smoke tests on the chosen device:
a host -> device -> host round trip from pinned memory with ``non_blocking=True``, and a matmul
compared with a float64 CPU reference. Each problem comes with a verdict and a fix.

Exit status: 0 when the requested device is usable, 1 when it is not, 2 for a usage error.

A driver or GPU that hangs must not hang the doctor: after ``--timeout`` seconds (300 by default,
at least 1; 0 for no limit) it says where it was stuck and exits 1, with a driver's fixes where a
driver or device is involved, else saying that the limit is likely too short for the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import math
import os
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from torchplace import report
from torchplace.doctor.assemble import collect
from torchplace.doctor.rendering import render
from torchplace.errors import ConfigError

__all__ = ["configure", "run"]

_DEFAULT_TIMEOUT_S = 300.0
_MAX_TIMEOUT_S = 1e6
#: the shortest limit: the checks themselves take a good part of a second on a healthy machine
_MIN_TIMEOUT_S = 1.0


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
    parser.add_argument(
        "--timeout",
        type=float,
        default=_DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="give up on a driver, GPU or probe that does not answer: say where it was stuck "
        f"and exit 1 after this long (default {_DEFAULT_TIMEOUT_S:g}, at least "
        f"{_MIN_TIMEOUT_S:g}; 0: no limit)",
    )
    report.add_output_options(parser)


def run(args: argparse.Namespace) -> int:
    """Run the doctor; 0 when the requested device is usable, 1 when it is not."""
    report.check_output(args.output)
    report.check_stdout(args.output)
    limit = _timeout(args.timeout)
    report.require_torch()  # say why torch cannot be imported, not a traceback
    with _watchdog(limit):
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


def _timeout(seconds: float) -> float:
    """``--timeout`` in seconds (0: no limit), checked before any work."""
    if not (math.isfinite(seconds) and seconds >= 0):
        what = "is negative" if seconds < 0 else "is not a number of seconds"
        raise ConfigError(
            f"--timeout {seconds:g} {what}; give a number of seconds such as "
            f"{_DEFAULT_TIMEOUT_S:g} (the default), or 0 for no limit"
        )
    if 0 < seconds < _MIN_TIMEOUT_S:
        raise ConfigError(
            f"--timeout {seconds:g} is under {_MIN_TIMEOUT_S:g} s, too short for the checks "
            "themselves (torch's device modules, a device context, the smoke tests), which take "
            "a good part of a second on a healthy machine: the limit would stop work that is "
            f"not stuck; give {_MIN_TIMEOUT_S:g} or more (the default is "
            f"{_DEFAULT_TIMEOUT_S:g}), or 0 for no limit"
        )
    if seconds > _MAX_TIMEOUT_S:  # past what the watchdog's timers can wait for
        raise ConfigError(
            f"--timeout {seconds:g} is over {_MAX_TIMEOUT_S:g} seconds (11 days); give 0 for "
            "no limit"
        )
    return seconds


@contextlib.contextmanager
def _watchdog(seconds: float) -> Iterator[None]:
    """Give up on a doctor that gets no answer for ``seconds``: say where it was stuck, exit 1.

    A Python thread says it when the stuck call lets other threads run (NVML through ctypes, a
    subprocess, a synchronize). A call that holds the interpreter lock (torch's own calls into
    the driver do) stops every Python thread, so faulthandler, whose watchdog needs no lock,
    dumps where each thread is and exits 1 a little later.
    """
    if not seconds:
        yield
        return
    stuck = threading.get_ident()

    def give_up() -> None:
        print(
            f"torchplace doctor: no answer within {seconds:g} s{_where(stuck)}: "
            f"{_hang_advice(stuck)}",
            file=sys.__stderr__,
            flush=True,
        )
        os._exit(report.EXIT_FAILED)  # the stuck call cannot be interrupted; end the process

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    backstop = True
    try:
        faulthandler.dump_traceback_later(seconds * 1.25 + 1, exit=True, file=2)
    except (OSError, ValueError, RuntimeError):  # no descriptor 2 to write to
        backstop = False
    try:
        yield
    finally:
        timer.cancel()
        if backstop:
            faulthandler.cancel_dump_traceback_later()


#: where a thread that waits is waiting on a driver or a device: the device probes, torch's
#: device modules, NVML
_DEVICE_CODE = (
    f"{os.sep}torchplace{os.sep}devices{os.sep}",
    f"{os.sep}torchplace{os.sep}doctor{os.sep}probes.py",
    f"{os.sep}torch{os.sep}cuda{os.sep}",
    f"{os.sep}torch{os.sep}mps{os.sep}",
    f"{os.sep}torch{os.sep}xpu{os.sep}",
    f"{os.sep}pynvml",
)
#: what a GPU driver leaves on a Linux machine: NVIDIA's, and AMD's (ROCm)
_DRIVER_FILES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")


def _hang_advice(thread: int) -> str:
    """What to do about a doctor stuck in ``thread``: a driver's fixes where a driver or device
    is involved; else the limit, which is likely too short for this machine."""
    limit = "--timeout SECONDS changes the limit (0: no limit)."
    if _driver_loaded() or _waiting_on_a_device(thread):
        return (
            "a driver, GPU or probe that hangs. Fix: run 'nvidia-smi' (or 'rocm-smi'; if it "
            "hangs too, the driver is stuck: look for Xid errors in 'dmesg', then reset the GPU "
            "or reboot); 'torchplace doctor --no-smoke' skips the smoke tests; if the machine "
            f"is only slow (loaded, swapping), {limit}"
        )
    return (
        "no GPU driver is loaded here and the doctor was not waiting on a device, so the limit "
        "is likely too short for this machine (loaded, swapping, slow to import). Fix: run "
        f"again with a longer --timeout (default {_DEFAULT_TIMEOUT_S:g}), or 0 for no limit."
    )


def _driver_loaded() -> bool:
    return any(os.path.exists(path) for path in _DRIVER_FILES)


def _waiting_on_a_device(thread: int) -> bool:
    """Whether ``thread`` is in a call that asks a driver or a device (its frames, inner out)."""
    frame = sys._current_frames().get(thread)
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _DEVICE_CODE):
            return True
        frame = frame.f_back
    return False


def _where(thread: int) -> str:
    """`` in is_available (torch/cuda/__init__.py:174), called from TorchProbe.cuda_available
    (torchplace/devices/probe.py:138)``: the innermost call the thread is in, and the probe's."""
    frame = sys._current_frames().get(thread)
    if frame is None:  # pragma: no cover - the thread ended meanwhile
        return ""
    probes = f"{os.sep}torchplace{os.sep}devices{os.sep}"  # where TorchProbe asks torch
    text = f" in {_frame(frame)}"
    caller: FrameType | None = frame.f_back
    while caller is not None and probes not in caller.f_code.co_filename:
        caller = caller.f_back
    if caller is not None and probes not in frame.f_code.co_filename:
        text += f", called from {_frame(caller)}"
    return text


def _frame(frame: FrameType) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)  # Python 3.11+
    path = "/".join(code.co_filename.replace(os.sep, "/").split("/")[-3:])
    return f"{name} ({path}:{frame.f_lineno})"
