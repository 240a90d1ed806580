"""Triton's GPU and CPU gauges in ``/metrics`` (:mod:`torchplace.serve.triton_devices`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from torchplace.serve.triton_devices import CpuUsage, GpuReading, cpu_memory, devices_text


def _stat(path: Path, user: int, idle: int, iowait: int = 0, steal: int = 0) -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    path.write_text(f"cpu  {user} 0 0 {idle} {iowait} 0 0 {steal} 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")


def test_cpu_utilization_is_the_busy_share_between_two_readings(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, user=100, idle=100)
    usage = CpuUsage(stat)
    _stat(stat, user=130, idle=160, iowait=10, steal=0)  # +30 busy, +70 idle (with iowait)
    assert usage.utilization() == pytest.approx(0.3)
    _stat(stat, user=190, idle=160, iowait=10, steal=20)  # +80 busy (steal counts), +0 idle
    assert usage.utilization() == pytest.approx(1.0)
    assert usage.utilization() == 0.0  # nothing passed


def test_a_host_without_proc_leaves_the_cpu_gauges_out(tmp_path: Path) -> None:
    usage = CpuUsage(tmp_path / "missing")
    assert usage.utilization() is None
    assert cpu_memory(tmp_path / "missing") is None
    text = devices_text([], usage, meminfo=tmp_path / "missing")
    assert text == b""


def test_cpu_memory_used_is_total_less_available(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nMemFree:  100 kB\nMemAvailable:  250 kB\n")
    assert cpu_memory(meminfo) == (1000 * 1024, 750 * 1024)


def test_each_gpu_once_by_its_uuid_and_unknown_values_left_out(tmp_path: Path) -> None:
    readings = {
        "cuda:0": GpuReading("GPU-aaaa", 80, 30, utilization=0.5, power_watts=250.0),
        "cuda:1": GpuReading("GPU-bbbb", 40, 10),  # no NVML: utilization and power unknown
    }
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8 kB\nMemAvailable: 2 kB\n")
    text = devices_text(["cuda:1", "cpu", "cuda:0", "cuda:0"], None, probe=readings.get,
                        meminfo=meminfo)  # fmt: skip
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    used = {s.labels["gpu_uuid"]: s.value for s in families["nv_gpu_memory_used_bytes"].samples}
    assert used == {"GPU-aaaa": 30, "GPU-bbbb": 10}
    utilization = families["nv_gpu_utilization"].samples
    assert [(s.labels["gpu_uuid"], s.value) for s in utilization] == [("GPU-aaaa", 0.5)]
    assert families["nv_gpu_power_usage"].samples[0].value == 250.0
    assert families["nv_cpu_memory_used_bytes"].samples[0].value == 6 * 1024
    assert "nv_cpu_utilization" not in families  # no usage kept: left out
    assert text.count(b"# TYPE nv_gpu_memory_total_bytes gauge") == 1


@pytest.mark.cuda
def test_a_real_gpu_reads_as_triton_labels_it() -> None:
    from torchplace.serve.triton_devices import gpu_reading

    reading = gpu_reading("cuda:0")
    assert reading is not None
    assert reading.uuid.startswith("GPU-")
    assert 0 < reading.used_bytes <= reading.total_bytes
    if reading.utilization is not None:
        assert 0.0 <= reading.utilization <= 1.0
