#!/usr/bin/env python3
"""all_reduce / all_gather / alltoall / reduce_scatter through torch.distributed (NCCL),
printed in nccl-tests' column format so busbw.py reads it. Launch with torchrun
(bench/nccl-tests/torchrun.sh, or arena-submit.sh). Rank 0 prints; every rank
checks its result once per size (#wrong column)."""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist

FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "alltoall": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n}


def run_op(op, buf, out, n):
    if op == "all_reduce":
        dist.all_reduce(buf)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, buf)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, buf)
    else:
        dist.all_to_all_single(out, buf)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", choices=sorted(FACTOR), default="all_reduce")
    ap.add_argument("-b", "--min-bytes", type=int, default=8)
    ap.add_argument("-e", "--max-bytes", type=int, default=1 << 30)
    ap.add_argument("-f", "--factor", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    a = ap.parse_args()

    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    names = [None] * n
    dist.all_gather_object(names, (socket.gethostname(), local, torch.cuda.get_device_name()))
    if rank == 0:
        print(f"# Collective test starting: {a.op}_perf")
        print(f"# torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
        for r, (host, dev, name) in enumerate(names):
            print(f"#  Rank {r:2d} Group  0 Pid {0:6d} on {host} device {dev:2d} [0x00] {name}")
        print("#       size         count      type   redop    root     time   algbw   busbw #wrong")
        print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")
    size = a.min_bytes
    total_bw = []
    while size <= a.max_bytes:
        count = max(size // 4 // n * n, n)  # divisible by n for the scatter-style ops
        nbytes = count * 4
        buf = torch.full((count,), float(rank + 1), device="cuda")
        if a.op == "all_gather":
            buf = torch.full((count // n,), float(rank + 1), device="cuda")
            out = torch.empty(count, device="cuda")
        elif a.op == "reduce_scatter":
            out = torch.empty(count // n, device="cuda")
        else:
            out = torch.empty(count, device="cuda")
        run_op(a.op, buf, out, n)  # one checked run
        torch.cuda.synchronize()
        if a.op in ("all_reduce", "reduce_scatter"):
            got = buf if a.op == "all_reduce" else out
            wrong = int((got != n * (n + 1) / 2).sum())
        elif a.op == "all_gather":
            want = torch.arange(1, n + 1, device="cuda").repeat_interleave(count // n).float()
            wrong = int((out != want).sum())
        else:
            want = torch.arange(1, n + 1, device="cuda").repeat_interleave(count // n).float()
            wrong = int((out != want).sum())
        for _ in range(a.warmup):
            run_op(a.op, buf, out, n)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            run_op(a.op, buf, out, n)
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / a.iters * 1e6
        wrong_t = torch.tensor([wrong], device="cuda")
        dist.all_reduce(wrong_t)
        algbw = nbytes / us / 1e3
        busbw = algbw * FACTOR[a.op](n)
        total_bw.append(busbw)
        if rank == 0:
            print(f"{nbytes:12d}  {count:12d}     float     sum      -1  {us:8.2f}  {algbw:6.2f}"
                  f"  {busbw:6.2f}  {int(wrong_t.item()):5d}", flush=True)
        size *= a.factor
    if rank == 0:
        print(f"# Avg bus bandwidth    : {sum(total_bw) / len(total_bw):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
