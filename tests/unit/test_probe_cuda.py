"""The CUDA backend skips cleanly without bindings, driver or GPU (no GPU needed here)."""

from __future__ import annotations

import enum
import sys
import types

import pytest

from topod.probe.backend import ProbeUnavailable
from topod.probe.cuda import CudaBackend, cuda_unavailable_reason, load_driver, normalize_bus_id


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NO_DEVICE = 100


def install_fake_driver(monkeypatch, **calls):
    driver = types.ModuleType("cuda.bindings.driver")
    driver.CUresult = CUresult
    driver.cuGetErrorName = lambda err: (CUresult.CUDA_SUCCESS, CUresult(err).name.encode())
    for name, fn in calls.items():
        setattr(driver, name, fn)
    package, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    bindings.driver = driver
    package.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", package)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)


def test_missing_bindings_say_how_to_install_them(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(ProbeUnavailable, match="cuda-python is not installed"):
        load_driver()
    assert "not installed" in cuda_unavailable_reason()


def test_a_driver_without_gpus_is_reported_not_raised(monkeypatch):
    install_fake_driver(monkeypatch, cuInit=lambda flags: (CUresult.CUDA_ERROR_NO_DEVICE,))
    assert cuda_unavailable_reason() == "cuInit failed: CUDA_ERROR_NO_DEVICE"
    with pytest.raises(ProbeUnavailable, match="CUDA_ERROR_NO_DEVICE"):
        CudaBackend.open(topology=None)


def test_missing_libcuda_is_reported_as_no_driver(monkeypatch):
    def cu_init(flags):
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    install_fake_driver(monkeypatch, cuInit=cu_init)
    assert cuda_unavailable_reason().startswith("no NVIDIA driver")


def test_zero_devices_is_a_reason_to_skip(monkeypatch):
    install_fake_driver(monkeypatch, cuInit=lambda flags: (CUresult.CUDA_SUCCESS,),
                        cuDeviceGetCount=lambda: (CUresult.CUDA_SUCCESS, 0))
    assert cuda_unavailable_reason() == "the driver sees no GPU"


def test_bus_ids_take_the_sysfs_spelling():
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("0000:3b:00.0\x00") == "0000:3b:00.0"
