"""The one target vocabulary: named targets, the running device detected from what the driver
reports, resolution of a name once."""

from __future__ import annotations

import platform

import pytest
import torch

from pto.errors import UsageError
from pto.machine.target import NAMED, KiB, detect, get, resolve


def test_named_targets():
    assert {"arm64", "x86_64", "cuda_h100", "cuda_h200", "cuda_a100", "ascend910b"} <= set(NAMED)
    h100 = get("cuda_h100")
    assert (h100.arch, h100.sram_bytes, h100.sm_count, h100.capability) == ("sm90", 227 * KiB, 132, (9, 0))
    assert get("ascend910b").sram_bytes == 256 * KiB and get("ascend910b").capability is None
    assert not get("x86_64").is_gpu and h100.is_gpu
    with pytest.raises(UsageError, match=r"unknown target 'tpu' \(choose from arm64, x86_64"):
        get("tpu")


def test_host_is_detected_and_names_resolve_once():
    host = detect("cpu")
    assert host.kind == "cpu"
    assert host.arch == ("arm64" if platform.machine().lower() in ("arm64", "aarch64") else "x86_64")
    assert resolve(None, "cpu") is host
    assert resolve("cuda_a100", "cpu") is NAMED["cuda_a100"]  # a name wins over the device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_is_described_by_its_driver():
    """The detected target carries the device's own numbers, not a neighbour's (an H200 is not
    given an H100's memory, an sm_89 card not an H100's shared memory)."""
    p = torch.cuda.get_device_properties(0)
    t = detect("cuda")
    assert t.arch == f"sm{p.major}{p.minor}" and t.sm_count == p.multi_processor_count
    assert t.sram_bytes == p.shared_memory_per_block_optin
    assert t.memory_bytes == p.total_memory and t.device_name == p.name
