"""OpenVINO's side of native/examples/bench_unet.rs: the same diffusers UNet2DConditionModel
(random weights from the same configuration) converted with `openvino.convert_model` and
compiled for the CPU, one call (one sampling step with classifier-free guidance, batch 2)
at f32 and, where the CPU has native bf16, with the bf16 inference precision hint; best
time of --reps each, the thread count pinned with INFERENCE_NUM_THREADS. The conversion
traces the PyTorch model, so the process's peak resident memory holds both and is not
OpenVINO's own: the memory printed is the rise from compiling and running a compiled
model. Prints one JSON line; exits non-zero where `openvino` is not installed.

    python bench/openvino_unet.py --threads 2 --reps 2 --cases '[{"config": {...}, "latent": 64,
        "tokens": 77}, ...]'
"""
import gc
import json
import resource

import torch

from bench_args import best, parser, start, unet_case

p = parser()
p.add_argument("--cases", type=str, default="[]")
a = start(p)

import diffusers  # noqa: E402
import openvino as ov  # noqa: E402


def rss_mib():
    # The current resident set (Linux), to see what compiling and running add.
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


class Step(torch.nn.Module):
    """The UNet call as a plain function of tensors, for the tracer."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, x, t, ctx):
        return self.unet(x, t, ctx, return_dict=False)[0]


core = ov.Core()
bf16 = "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
out = {"version": ov.__version__, "threads": a.threads, "step": [], "step_bf16": [], "rise_mib": []}
with torch.inference_mode():
    for case in json.loads(a.cases):
        model, x, t, ctx = unet_case(diffusers, case)
        ov_model = ov.convert_model(Step(model), example_input=(x, t, ctx))
        del model
        gc.collect()
        inputs = [x.numpy(), t.numpy(), ctx.numpy()]
        rise = 0.0
        for hint, key in [("f32", "step"), ("bf16", "step_bf16")]:
            if hint == "bf16" and not bf16:
                out[key].append(None)
                continue
            before = rss_mib()
            compiled = core.compile_model(
                ov_model,
                "CPU",
                {"INFERENCE_NUM_THREADS": a.threads, "INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"},
            )
            request = compiled.create_infer_request()
            out[key].append(best(lambda: request.infer(inputs), a.reps))
            rise = max(rise, rss_mib() - before)
            del request, compiled
            gc.collect()
        out["rise_mib"].append(rise)
print(json.dumps(out))
