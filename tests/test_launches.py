"""moe_gemm.torch.launches: a launch is built once per set of pointers and stream, and the oldest set goes
first past MAX_PACKED (no GPU: the driver and torch's stream lookups are stood in for)."""

from __future__ import annotations

import pytest
import torch

from moe_gemm.cuda import device
from moe_gemm.torch.launches import PointerLaunches


class Counted(PointerLaunches):
    MAX_PACKED = 2

    def __init__(self) -> None:
        super().__init__(index=0)
        self.built, self.ran = [], []

    def build(self, pointers, stream):
        self.built.append((pointers, stream))
        return lambda: self.ran.append((pointers, stream))


class Pointer:
    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


@pytest.fixture
def stream(monkeypatch):
    current = {"stream": 7}
    monkeypatch.setattr(device, "make_context_current", lambda index: None)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: current["stream"], raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return current


def test_a_launch_is_built_once_per_pointers_and_stream(stream):
    launches = Counted()
    a, b = Pointer(16), Pointer(32)
    launches(a, b)
    launches(a, b)
    assert launches.built == [((16, 32), 7)] and launches.ran == [((16, 32), 7)] * 2
    launches(b, a)  # the order of the tensors is the order of the pointers
    stream["stream"] = 9  # another stream: a launch of its own
    launches(a, b)
    assert launches.built == [((16, 32), 7), ((32, 16), 7), ((16, 32), 9)]


def test_past_max_packed_the_oldest_set_is_dropped(stream):
    launches = Counted()
    for address in (16, 32, 48):
        launches(Pointer(address))
    assert list(launches.launches) == [(32, 7), (48, 7)]
    launches(Pointer(16))  # built again
    assert len(launches.built) == 4 and len(launches.launches) == 2
