"""Admission of a request: its priority level, its deadline, and whether the queue takes it.

:class:`QueuePolicy` holds the server's rules (``--priority-levels``, ``--default-priority``,
``--max-queue`` per level or ``--priority-queue-limits``, ``--default-timeout-ms``,
``--max-queue-wait-ms``), validated at construction.

* **Priority.** Levels run from 1 (served first) to ``priority_levels``; a request's
  ``priority`` parameter picks one, 0 or none means the default level (Triton's convention),
  and so does a priority past the last level (as Triton's ``InferenceRequest::SetPriority``
  has it: a client written for a deployment with more levels is served, not refused).
  Each level has its own queue limit; a batch takes the highest levels first.
* **Deadline.** A request's ``timeout`` parameter (microseconds, as Triton has it) or its
  ``Inference-Timeout-Us`` header, else the server default, sets a deadline from its arrival.
  A request still queued when its deadline passes is removed before it reaches the device and
  answered 504 (:class:`DeadlineExceededError`); one already running finishes.
* **Overload.** :class:`WaitEstimate` keeps a moving average of the time a batch takes; a new
  request is refused at once with 503 + Retry-After (:class:`~torchplace.errors.OverloadedError`)
  when the batches already queued ahead of it would take longer than ``max_queue_wait_s`` on
  the serving replicas (one full batch per replica may always wait, so that none idles between
  batches). The queue then never holds more work than that: the accepted requests' latency
  stays bounded by about ``max_queue_wait_s`` (or one batch) plus their own batch, however
  large the excess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchplace.errors import ConfigError, DeadlineExceededError

__all__ = ["DeadlineExceededError", "QueuePolicy", "WaitEstimate"]


@dataclass(frozen=True, kw_only=True)
class QueuePolicy:
    """Priority levels, queue limits, the default deadline and the overload limit."""

    max_queue: int = 1024
    priority_levels: int = 1
    #: the level of a request that names none (None: the lowest, ``priority_levels``)
    default_priority: int | None = None
    #: a queue limit per level, highest first (None: ``max_queue`` each)
    queue_limits: tuple[int, ...] | None = None
    default_timeout_s: float | None = None
    #: refuse a request when the queued work ahead of it would take longer (None: never)
    max_queue_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise ConfigError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.priority_levels < 1:
            raise ConfigError(f"priority_levels must be >= 1, got {self.priority_levels}")
        default = self.default_priority
        if default is not None and not 1 <= default <= self.priority_levels:
            raise ConfigError(
                f"default_priority={default} is not a level in 1..{self.priority_levels}; "
                "1 is served first"
            )
        limits = self.queue_limits
        if limits is not None and (
            len(limits) != self.priority_levels or any(n < 1 for n in limits)
        ):
            raise ConfigError(
                f"queue_limits={list(limits)} needs one limit >= 1 per priority level "
                f"({self.priority_levels}), highest level first"
            )
        for name in ("default_timeout_s", "max_queue_wait_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name}={value!r} must be a finite number > 0, or None")

    @property
    def limits(self) -> tuple[int, ...]:
        """The queue limit of each level, highest first."""
        return self.queue_limits or (self.max_queue,) * self.priority_levels

    def level(self, priority: int | None) -> int:
        """The queue index (0 = highest) of a request's ``priority`` (0, None or a priority
        past the last level: the default level, as in Triton)."""
        if priority is None or not 1 <= priority <= self.priority_levels:
            return (self.default_priority or self.priority_levels) - 1
        return priority - 1

    def timeout(self, timeout_s: float | None) -> float | None:
        """The request's timeout in seconds: its own, else the server default; None: none."""
        return timeout_s if timeout_s else self.default_timeout_s


class WaitEstimate:
    """How long the queued work takes: a moving average of batch times (on the event loop)."""

    __slots__ = ("batch_s",)

    def __init__(self) -> None:
        self.batch_s = 0.0  # nothing measured yet: nothing is refused

    def record(self, seconds: float) -> None:
        """Fold in one batch's time (first batch taken as it is)."""
        self.batch_s = seconds if self.batch_s == 0.0 else 0.8 * self.batch_s + 0.2 * seconds

    def wait(self, queued_rows: int, max_batch_size: int, replicas: int) -> float:
        """Seconds before a request queued behind ``queued_rows`` rows starts."""
        if queued_rows <= 0 or replicas <= 0:
            return 0.0
        return math.ceil(queued_rows / max_batch_size) * self.batch_s / replicas
