from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchplace.bench.link import (
    lane_bytes_per_second,
    link_from_nvml,
    link_from_sysfs,
    read_link,
)

BUS = "0000:3b:00.0"


def sysfs(tmp_path: Path, speed: str, width: str) -> Path:
    device = tmp_path / BUS
    device.mkdir()
    (device / "current_link_speed").write_text(speed + "\n")
    (device / "current_link_width").write_text(width + "\n")
    return tmp_path


def test_lane_rates_follow_the_line_encoding() -> None:
    assert lane_bytes_per_second(2.5) == pytest.approx(2.5e9 * 0.8 / 8)  # 8b/10b
    assert lane_bytes_per_second(8.0) == pytest.approx(8e9 * 128 / 130 / 8)  # 128b/130b
    assert lane_bytes_per_second(64.0) == pytest.approx(64e9 * 242 / 256 / 8)  # FLIT


def test_sysfs_gen5_x16(tmp_path: Path) -> None:
    link = link_from_sysfs(BUS, root=sysfs(tmp_path, "32.0 GT/s PCIe", "16"))
    assert link is not None
    assert link.generation == 5
    assert link.width == 16
    assert link.peak_bytes_per_s == pytest.approx(16 * 32e9 * 128 / 130 / 8)
    assert "gen5 x16" in str(link)
    assert link.to_dict()["width"] == 16


@pytest.mark.parametrize(
    ("speed", "width"), [("Unknown", "16"), ("8.0 GT/s PCIe", "x"), ("8 GT/s", "0")]
)
def test_sysfs_unreadable_values(tmp_path: Path, speed: str, width: str) -> None:
    assert link_from_sysfs(BUS, root=sysfs(tmp_path, speed, width)) is None


def test_sysfs_missing_device(tmp_path: Path) -> None:
    assert link_from_sysfs(BUS, root=tmp_path) is None


class FakeNvml:
    def __init__(self, generation: int = 4, width: int = 16, fail: bool = False) -> None:
        self.generation, self.width, self.fail = generation, width, fail
        self.asked: list[str] = []
        self.shutdown = False

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> Any:
        self.asked.append(bus)
        return object()

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self.generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self.width


def test_nvml_is_asked_with_its_own_bus_id_spelling() -> None:
    nvml = FakeNvml(generation=4, width=8)
    link = link_from_nvml(BUS, nvml=nvml)
    assert nvml.asked == ["00000000:3B:00.0"]
    assert nvml.shutdown
    assert link is not None
    assert (link.generation, link.width, link.source) == (4, 8, "NVML")
    assert link.peak_bytes_per_s == pytest.approx(8 * 16e9 * 128 / 130 / 8)


def test_read_link_prefers_nvml_then_sysfs(tmp_path: Path) -> None:
    root = sysfs(tmp_path, "16.0 GT/s PCIe", "16")
    link, note = read_link(BUS, nvml=FakeNvml(generation=5), root=root)
    assert link is not None
    assert link.source == "NVML"
    link, note = read_link(BUS, nvml=FakeNvml(fail=True), root=root)
    assert link is not None
    assert link.source.startswith("sysfs")
    assert note == str(link)


def test_read_link_says_why_it_failed(tmp_path: Path) -> None:
    link, note = read_link(BUS, nvml=FakeNvml(fail=True), root=tmp_path)
    assert link is None
    assert "torchplace[nvml]" in note
    link, note = read_link(None)
    assert link is None
    assert "bus id" in note


def test_sysfs_accepts_the_eight_digit_domain_of_nvml_and_the_inventory(tmp_path: Path) -> None:
    root = sysfs(tmp_path, "16.0 GT/s PCIe", "16")
    for spelling in ("00000000:3B:00.0", "00000000:3b:00.0", BUS):
        link = link_from_sysfs(spelling, root=root)
        assert link is not None, spelling
        assert link.generation == 4


def test_cuda_bus_id_comes_from_the_device_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import torch

    from torchplace.bench.transfer import cuda_bus_id

    seen: list[int] = []

    def props(index: int) -> Any:
        seen.append(index)
        return types.SimpleNamespace(
            name="NVIDIA H200",
            major=9,
            minor=0,
            total_memory=1,
            multi_processor_count=132,
            pci_domain_id=0,
            pci_bus_id=0x3B,
            pci_device_id=0,
        )

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    assert cuda_bus_id(torch.device("cuda", 1)) == "00000000:3b:00.0"
    assert seen == [1]
