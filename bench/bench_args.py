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


def peak_mib():
    """This process's peak resident memory in MiB: the kernel's high-water mark of its own
    address space (VmHWM). Not `getrusage`'s ru_maxrss, which on Linux carries the
    high-water mark of the process that spawned it across fork and exec: a decode whose
    own peak is 2,090 MiB read 5,457 when started by a benchmark that had used 5.4 GB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def unet_case(diffusers, case):
    """A bench_unet case's diffusers UNet (random weights from its configuration) and one
    guided step's inputs (batch 2): the model, the latents, the timesteps, the prompt."""
    model = diffusers.UNet2DConditionModel(**case["config"]).eval()
    n = case["latent"]
    x = torch.randn(2, model.config.in_channels, n, n)
    ctx = torch.randn(2, case["tokens"], model.config.cross_attention_dim)
    t = torch.tensor([500.0, 500.0])
    return model, x, t, ctx


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
