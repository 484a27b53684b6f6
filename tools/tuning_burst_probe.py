"""Does a burst of tuning launches slow the launch timed right after it?

Chapter 08's first fused-epilogue table timed the fused GEMM 1 right after the op had tuned GEMM 1
alone at the same shape (a second or more of back-to-back launches near the board's power limit),
and read it up to a quarter slower than the same launch in the step split. This probe times the
fused launch (30 CUDA-graph replays) after 3 s idle, right after such a tuning burst, and after 3 s
idle again, and samples the SM clock and board power with nvidia-smi after each.

    python tools/tuning_burst_probe.py                      # DeepSeek-V3-like layer, 4,096 tokens
    python tools/tuning_burst_probe.py --layer qwen3 --tokens 32768

Needs an sm_90a GPU and torch. It tunes on an empty cache of its own (the NVRTC cubins copied from
yours), so your k6/auto cache is neither read nor changed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time


def gpu_state() -> str:
    """The SM clock, board power and temperature now, as nvidia-smi prints them."""
    query = "--query-gpu=clocks.sm,power.draw,temperature.gpu"
    smi = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, check=False)
    return smi.stdout.strip()


def empty_tuning_cache() -> None:
    """Point MOE_GEMM_CACHE at a new folder holding only the compiled kernels: every shape tunes anew."""
    from moe_gemm.cuda.nvrtc import cache_dir

    compiled, fresh = cache_dir(), tempfile.mkdtemp(prefix="moe_gemm_probe_")
    if compiled.exists():
        shutil.copytree(compiled, os.path.join(fresh, compiled.name))
    os.environ["MOE_GEMM_CACHE"] = fresh


def main() -> None:
    from moe_gemm.model.workloads import LAYERS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layer", choices=list(LAYERS), default="deepseek", help="layer size (default deepseek)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens (default 4096)")
    parser.add_argument("--rest", type=float, default=3.0, help="seconds idle before a rested timing (default 3)")
    args = parser.parse_args()
    empty_tuning_cache()

    import torch

    from moe_gemm.measure.layer import seeded_layer
    from moe_gemm.torch.bench import time_call
    from moe_gemm.torch.layer import dispatch
    from moe_gemm.torch.ops import grouped_mm, grouped_mm_swiglu, offsets_unchecked

    shape = LAYERS[args.layer]
    layer = seeded_layer(shape)  # the layer chapter 08 measures
    x = torch.randn(args.tokens, shape.hidden, device="cuda").to(torch.bfloat16)
    with torch.no_grad(), offsets_unchecked():
        _, _, offs, rows = dispatch(x, layer.gate, layer.top_k, layer.normalize)

        def fused() -> torch.Tensor:
            return grouped_mm_swiglu(rows, layer.w_gate_up_fused, offs)

        def timed(label: str) -> None:
            print(f"{label:<28} {time_call(fused, graph=True).median_ms:7.3f} ms   {gpu_state()}", flush=True)

        fused()  # tunes the fused launch
        torch.cuda.synchronize()
        time.sleep(args.rest)
        timed("fused, rested")
        start = time.time()
        grouped_mm(rows, layer.w_gate_up, offs)  # tunes GEMM 1 alone: the burst
        torch.cuda.synchronize()
        print(f"{'GEMM 1 alone tuned in':<28} {time.time() - start:7.1f} s    {gpu_state()}", flush=True)
        timed("fused, right after")
        time.sleep(args.rest)
        timed("fused, rested again")
    print("median of 30 graph replays; clock, power, temperature: nvidia-smi's sample after each timing")


if __name__ == "__main__":
    main()
