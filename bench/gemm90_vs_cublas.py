#!/usr/bin/env python3
"""gemm90_vs_cublas.py — kiln's sm_90a prefill matmul (kcu_gemm90) beside cuBLAS.

Times torch.matmul(x, w.T) in bf16 (cuBLAS: the ceiling, never part of kiln) on
Llama-3-8B's prefill matmuls y[T, N] = x[T, K] w[N, K]^T at T = 128, 256, 512, 1024 and 2048,
and, with --kiln, runs tests/cuda/cuda_gemm90_check --gpu CUBIN first and reads
its "TIME shape T K N BN STAGES ms TFLOP/s" lines; prints TFLOP/s per shape
for both and the ratio (kiln's best tile configuration, and each one).

    python3 bench/gemm90_vs_cublas.py [--kiln BIN --cubin CUBIN]

Timing as the C side times: two warm-up launches, then the median of 5
batches of about 3 ms each, between CUDA events; random data (never zeros).
"""
import argparse
import subprocess
import sys

SHAPES = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672),
          ("down", 14336, 4096), ("lm_head", 4096, 128256),
          ("qkv_rms", 4096, 6144)]  # kiln with the RMSNorm prologue; cuBLAS the plain matmul
TOKENS = [128, 256, 512, 1024, 2048]


def time_cublas(torch, T, K, N):
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    flop = 2.0 * T * N * K
    reps = int(3e-3 / (flop / 600e12)) + 2
    torch.matmul(x, w.t())
    torch.matmul(x, w.t())
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            torch.matmul(x, w.t())
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / reps)
    ms = sorted(times)[2]
    return ms, flop / (ms * 1e-3) / 1e12


def run_kiln(binary, cubin):
    """{(shape, T): [(BN, STAGES, ms, tflops)]} and the checks' exit status"""
    try:
        proc = subprocess.run([binary, "--gpu", cubin], capture_output=True, text=True, timeout=400)
    except subprocess.TimeoutExpired as e:  # a hung kernel: report what it printed
        sys.stdout.write(e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or ""))
        print("cuda_gemm90_check: timed out after 400 s")
        return {}, 1
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    res = {}
    for line in proc.stdout.splitlines():
        f = line.split()
        if len(f) == 9 and f[0] == "TIME":
            res.setdefault((f[1], int(f[2])), []).append((int(f[5]), int(f[6]), float(f[7]), float(f[8])))
    return res, proc.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", help="cuda_gemm90_check binary")
    ap.add_argument("--cubin", help="its kernels, compiled for sm_90a (cuda_gemm90_check --compile)")
    args = ap.parse_args()
    kiln, rc = ({}, 0)
    if args.kiln:
        kiln, rc = run_kiln(args.kiln, args.cubin)
    import torch
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
    for name, K, N in SHAPES:
        for T in TOKENS:
            ms, tf = time_cublas(torch, T, K, N)
            rows.append((name, T, K, N, ms, tf))
    print()
    print(f"{'matmul':8} {'T':>5} {'K':>6} {'N':>7} | {'cuBLAS':>7} | {'kiln':>7} {'tile':>7} {'ratio':>6} | each tile (BN/STAGES: TFLOP/s)")
    for name, T, K, N, ms, tf in rows:
        runs = kiln.get((name, T), [])
        if runs:
            best = max(runs, key=lambda r: r[3])
            each = "  ".join(f"{bn}/{st}: {t:.0f}" for bn, st, _, t in runs)
            print(f"{name:8} {T:5} {K:6} {N:7} | {tf:7.1f} | {best[3]:7.1f} {best[0]:>3}/{best[1]:<3} {best[3] / tf:6.2f} | {each}")
        else:
            print(f"{name:8} {T:5} {K:6} {N:7} | {tf:7.1f} | {'-':>7}")
        # the same in clusters of two blocks sharing the weight tile
        for tail in ("_c2",):
            runs = kiln.get((name + tail, T), [])
            if runs:
                best = max(runs, key=lambda r: r[3])
                each = "  ".join(f"{bn}/{st}: {t:.0f}" for bn, st, _, t in runs)
                print(f"{name + tail:8} {T:5} {K:6} {N:7} | {tf:7.1f} | {best[3]:7.1f} {best[0]:>3}/{best[1]:<3} {best[3] / tf:6.2f} | {each}")
    print("(TFLOP/s = 2 T N K / time; cuBLAS = torch.matmul bf16, bf16 out; kiln = kcu_gemm90, bf16 out)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
