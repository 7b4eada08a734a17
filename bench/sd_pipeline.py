"""One Stable Diffusion 1.5 picture as a user makes it, 512 x 512 with guidance, on the
same folder of random weights at the published sizes (bench/sd15_folder.py), by ours
(the text_to_image example: f32, and int8 with mixed precision), diffusers'
StableDiffusionPipeline (float32, and under bf16 autocast where the CPU has bf16;
bench/torch_sd_pipeline.py) and stable-diffusion.cpp's sd-cli (f16 and q8_0 weights;
bench/setup_sd_cpp.sh builds it), one process each, in one run. Prints one table:
seconds per picture (prompt + denoising + decode, not the load), seconds a step, each
process's peak resident memory, and each peer's time over ours.

    bash bench/setup_sd_cpp.sh
    cargo build --release -p rusting_brain --features images --example text_to_image
    python bench/sd_pipeline.py --threads 2 --steps 20

The steps are DDIM's for ours and diffusers' (one UNet call of batch 2 a step) and Euler's
for stable-diffusion.cpp (its two guided calls of batch 1 a step): the same UNet work.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--sdcpp", default=os.environ.get("RB_SDCPP_DIR", "/var/tmp/rb-sdcpp"))
p.add_argument("--folder", default=None, help="default: $RB_SDCPP_DIR/sd15")
p.add_argument("--ours", default=os.path.join(root, "target", "release", "examples", "text_to_image"))
p.add_argument("--only", default="", help="comma-separated rows to run (ours,ours-q8,diffusers,diffusers-bf16,sdcpp-f16,sdcpp-q8_0)")
a = p.parse_args()
folder = a.folder or os.path.join(a.sdcpp, "sd15")
prompt = "a lighthouse in fog"
env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))


def run(cmd):
    """Runs `cmd`; its output, wall seconds and peak resident memory (its own rusage)."""
    t = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if child.returncode != 0:
        print(f"{cmd[0]} failed ({child.returncode}):\n{out[-3000:]}", file=sys.stderr)
        return None
    return out, wall, usage.ru_maxrss / 1024


def ours(q8):
    cmd = [a.ours, folder, prompt, "/tmp/rb-sd-pipeline.png", "--steps", str(a.steps), "--size", "512x512",
           "--seed", "0", "--guidance", "7.5"] + (["--q8", "--bf16"] if q8 else [])
    r = run(cmd)
    if r is None:
        return None
    out, _, _ = r
    m = re.search(r"prompt ([\d.]+) s, denoise ([\d.]+) s \(([\d.]+) s/step\), decode ([\d.]+) s", out)
    peak = re.search(r"peak resident memory (\d+) MiB", out)
    prompt_s, denoise_s, _, decode_s = map(float, m.groups())
    return {"total_s": prompt_s + denoise_s + decode_s, "denoise_s": denoise_s, "prompt_s": prompt_s,
            "decode_s": decode_s, "peak_mib": float(peak.group(1)) if peak else r[2]}


def diffusers(bf16):
    cmd = [sys.executable, os.path.join(here, "torch_sd_pipeline.py"), "--folder", folder, "--threads",
           str(a.threads), "--steps", str(a.steps)] + (["--bf16"] if bf16 else [])
    r = run(cmd)
    if r is None:
        return None
    j = json.loads(r[0].strip().splitlines()[-1])
    return {"total_s": j["total_s"], "denoise_s": j["denoise_s"], "prompt_s": j["prompt_s"],
            "decode_s": j["decode_s"], "peak_mib": j["peak_mib"],
            "version": f"torch {j['version']}, diffusers {j['diffusers']}"}


def sdcpp(kind):
    cli = os.path.join(a.sdcpp, "build", "bin", "sd-cli")
    if not os.access(cli, os.X_OK):
        print(f"no {cli}: run bench/setup_sd_cpp.sh", file=sys.stderr)
        return None
    cmd = [cli, "-m", folder, "-p", prompt, "-W", "512", "-H", "512", "--steps", str(a.steps), "--cfg-scale",
           "7.5", "--sampling-method", "euler", "-t", str(a.threads), "--type", kind, "--seed", "0", "-o",
           "/tmp/rb-sd-pipeline-sdcpp.png"]
    r = run(cmd)
    if r is None:
        return None
    out, _, peak = r
    sampling = re.search(r"sampling completed, taking ([\d.]+)s", out)
    total = re.search(r"generate_image completed in ([\d.]+)s", out)
    prompt_s = re.search(r"get_learned_condition completed, taking ([\d.]+)s", out)
    decode_s = re.search(r"decode_first_stage completed, taking ([\d.]+)s", out)
    if not (sampling and total and prompt_s and decode_s):
        print(f"sd-cli printed no timings:\n{out[-3000:]}", file=sys.stderr)
        return None
    return {"total_s": float(total.group(1)), "denoise_s": float(sampling.group(1)),
            "prompt_s": float(prompt_s.group(1)), "decode_s": float(decode_s.group(1)), "peak_mib": peak}


def cpu():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        name = re.search(r"model name\s*: (.*)", text).group(1)
        flags = re.search(r"flags\s*: (.*)", text).group(1).split()
        isa = [f for f in ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"] if f in flags]
        return f"{name} ({', '.join(isa)})"
    except (OSError, AttributeError):
        return platform.processor()


rows = [("ours f32", "ours", lambda: ours(False)),
        ("ours Q8 + bf16", "ours-q8", lambda: ours(True)),
        ("diffusers f32", "diffusers", lambda: diffusers(False)),
        ("diffusers bf16 autocast", "diffusers-bf16", lambda: diffusers(True)),
        ("stable-diffusion.cpp f16", "sdcpp-f16", lambda: sdcpp("f16")),
        ("stable-diffusion.cpp q8_0", "sdcpp-q8_0", lambda: sdcpp("q8_0"))]
only = set(filter(None, a.only.split(",")))
commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
print(f"sd_pipeline: commit {commit}, {cpu()}, {a.threads} threads, SD 1.5 512 x 512, {a.steps} steps, "
      f"guidance 7.5, {folder}")
results = {}
for name, key, f in rows:
    if only and key not in only:
        continue
    results[name] = f()
    r = results[name]
    if r is not None:
        print(f"  {name}: {json.dumps(r)}", flush=True)
print()
# With fewer steps than a picture takes, the 20-step picture is also given as its parts'
# sum: prompt + 20 steps at the measured rate + decode (said in the header).
print(f"| {'one picture':<28} | {'s a picture':>11} | {'20 steps':>8} | {'s a step':>8} | {'prompt s':>8} "
      f"| {'decode s':>8} | {'peak MiB':>8} | {'over ours f32':>13} | {'over ours Q8':>12} |")
print(f"|{'-' * 30}|{'-' * 12}:|{'-' * 9}:|{'-' * 9}:|{'-' * 9}:|{'-' * 9}:|{'-' * 9}:|{'-' * 14}:|{'-' * 13}:|")
base = results.get("ours f32")
fast = results.get("ours Q8 + bf16")


def twenty(r):
    return r["prompt_s"] + 20 * r["denoise_s"] / a.steps + r["decode_s"]


for name, r in results.items():
    if r is None:
        print(f"| {name:<28} | {'(failed)':>11} | | | | | | | |")
        continue
    ratio = lambda ours_r: f"{twenty(r) / twenty(ours_r):.2f}x" if ours_r else "-"  # noqa: E731
    print(f"| {name:<28} | {r['total_s']:>11.1f} | {twenty(r):>8.1f} | {r['denoise_s'] / a.steps:>8.2f} "
          f"| {r['prompt_s']:>8.2f} | {r['decode_s']:>8.2f} | {r['peak_mib']:>8.0f} | {ratio(base):>13} "
          f"| {ratio(fast):>12} |")
print(f"s a picture: {a.steps} steps as run; 20 steps: prompt + 20 x (s a step) + decode; ratios on the "
      "20-step column, the peer's over ours.")
