"""CUDA graphs on the harness stream: capture one enqueue, replay it with one driver call.

A graph replays the same launches with the same arguments; what changes between replays is only
what the device buffers hold (a new routing's offsets, say), which is how an MoE layer runs a
device-scheduled grouped GEMM without a host round trip.
"""

from __future__ import annotations

from moe_gemm.cuda.device import check_driver, stream_handle


class Graph:
    """One launch captured on the harness stream as a CUDA graph, replayed by ``launch()``."""

    def __init__(self, enqueue) -> None:
        from cuda.bindings import driver

        stream = driver.CUstream(stream_handle())
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check_driver(driver.cuStreamBeginCapture(stream, mode))
        enqueue()
        self.graph = check_driver(driver.cuStreamEndCapture(stream))
        self.exec = check_driver(driver.cuGraphInstantiate(self.graph, 0))

    def launch(self) -> None:
        from cuda.bindings import driver

        check_driver(driver.cuGraphLaunch(self.exec, driver.CUstream(stream_handle())))

    def __del__(self) -> None:
        from cuda.bindings import driver

        driver.cuGraphExecDestroy(self.exec)
        driver.cuGraphDestroy(self.graph)
