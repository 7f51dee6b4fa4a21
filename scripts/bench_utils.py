"""What the benchmark scripts share: the relative error they report and their timing."""

import time

import torch


def rel(a, b):
    """Relative L2 error of `a` against the reference `b`, in fp32."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def cuda_ms(fn, iters=1, warmup=0):
    """Mean milliseconds per call of `fn()` over `iters` calls after `warmup` untimed ones: CUDA events when CUDA
    is up, else the wall clock (the CPU smoke runs of the benchmarks)."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1000 / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
