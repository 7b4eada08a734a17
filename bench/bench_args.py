"""What the PyTorch sides of the image benchmarks share: the --threads and --reps
arguments, the thread count and seed they set, and best-of-N timing."""
import argparse
import time

import torch


def parser():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    return p


def start(p):
    """Parses the arguments and applies --threads and the seed."""
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    return a


def best(f, reps, warm_up=True):
    """The shortest of `reps` timed calls of `f`, after one untimed call unless the caller
    made it already."""
    if warm_up:
        f()
    t = float("inf")
    for _ in range(reps):
        s = time.perf_counter()
        f()
        t = min(t, time.perf_counter() - s)
    return t
