"""Which GPU is here, if any. No GPU is a normal state on CI and laptops, not an error."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    driver_version: int  # e.g. 13000 for CUDA 13.0, as cuDriverGetVersion reports it

    @property
    def arch(self) -> str:
        """The NVRTC target for this GPU: the 'a' suffix unlocks wgmma/setmaxnreg (sm_90a) and tcgen05 (sm_100a)."""
        major, minor = self.compute_capability
        suffix = "a" if major >= 9 else ""
        return f"sm_{major}{minor}{suffix}"

    @property
    def slug(self) -> str:
        """A short file-name-safe name for results files: 'NVIDIA H200' -> 'h200'."""
        name = re.sub(r"^nvidia\s+", "", self.name.strip(), flags=re.IGNORECASE)
        name = re.sub(r"\b(sxm\d*|pcie|nvl|hbm\d*e?|\d+gb)\b", "", name, flags=re.IGNORECASE)
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"

    @property
    def driver_cuda(self) -> str:
        return f"{self.driver_version // 1000}.{self.driver_version % 1000 // 10}"


def _check(result: tuple) -> tuple:
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return tuple(values)


@functools.cache
def detect_gpu(ordinal: int = 0) -> GpuInfo | None:
    """Device ``ordinal``'s description, or None when there is no driver or no device."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    try:
        _check(driver.cuInit(0))
        (count,) = _check(driver.cuDeviceGetCount())
        if count <= ordinal:
            return None
        (device,) = _check(driver.cuDeviceGet(ordinal))
        (raw_name,) = _check(driver.cuDeviceGetName(256, device))
        attr = driver.CUdevice_attribute
        (major,) = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
        (minor,) = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
        (sms,) = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))
        (version,) = _check(driver.cuDriverGetVersion())
    except RuntimeError:
        return None
    name = raw_name.split(b"\0", 1)[0].decode()
    return GpuInfo(name=name, compute_capability=(int(major), int(minor)), sm_count=int(sms),
                   driver_version=int(version))


def require_capability(gpu: GpuInfo | None, minimum: tuple[int, int], variant: str) -> GpuInfo:
    """ValueError naming the variant and the architecture it needs, before any launch."""
    if gpu is None:
        raise ValueError(f"{variant} needs an NVIDIA GPU and none was found")
    if gpu.compute_capability < minimum:
        need = f"sm_{minimum[0]}{minimum[1]}"
        have = f"sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]}"
        raise ValueError(f"{variant} needs compute capability {need} or newer; {gpu.name} is {have}")
    return gpu
