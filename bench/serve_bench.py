#!/usr/bin/env python3
"""`rusting-brain-server` beside llama.cpp's `llama-server` on the same model, one server at
a time on the same cores: 1, 4 and 16 clients each stream chat completions (greedy, a
fixed reply budget) through OpenAI's API, and the table gives each server's aggregate
tokens/s (completion tokens of every request over the round's wall time) and time to
first token (request sent to the first chunk with text) at p50 and p95, with our ratio.

The model is SmolLM2-135M-Instruct: ours reads the f32 folder `bench/smollm2_folder.py`
writes and rounds it to int8 at load (`--q8`), or with `--same-file` the very Q8_0 GGUF
llama.cpp reads (its blocks taken as they are); llama.cpp reads the Q8_0 GGUF its
`llama-quantize` makes from the F32 GGUF of the same weights. Both get every core the
machine has and room for 16 requests at once (`--max-batch 16`; `-np 16` with 16 slots'
context).

Usage (after `bash bench/setup_llama_cpp.sh` and `python3 bench/smollm2_folder.py DIR
--f32-gguf DIR/f32.gguf`, then `llama-quantize DIR/f32.gguf DIR/q8_0.gguf Q8_0`):

    cargo build --release -p rusting_brain_server
    python3 bench/serve_bench.py --ours target/release/rusting-brain-server --folder DIR \\
        --llama-server $RB_LLAMA_DIR/build/bin/llama-server --gguf DIR/q8_0.gguf

Only the standard library.
"""

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time

PROMPTS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain in detail how a bicycle works, part by part.",
    "Describe a busy market in a coastal town in the morning.",
    "Tell me everything you know about the planets of the solar system.",
    "Write a letter to a friend about a trip to the mountains.",
    "Describe how bread is made, from the field to the table.",
    "Write a long poem about the sea and the wind.",
    "Explain how a city's water reaches every house.",
]


def cpu():
    """The CPU model and its vector instruction sets, from /proc/cpuinfo."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown", "", platform.processor()):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    isa = [f for f in ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8"] if f in flags]
    return model, isa


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, seconds=300):
    """Until GET /health answers 200 (llama-server answers 503 while it loads)."""
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it answered")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not answer /health in time")


def one_request(port, model, prompt, max_tokens):
    """Streams one chat completion: (seconds to the first text, completion tokens)."""
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    first, chunks, usage = None, 0, None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        v = json.loads(data)
        if v.get("usage"):
            usage = v["usage"].get("completion_tokens")
        for ch in v.get("choices") or []:
            if (ch.get("delta") or {}).get("content"):
                chunks += 1
                if first is None:
                    first = time.perf_counter() - start
    c.close()
    return (first if first is not None else time.perf_counter() - start), (usage if usage is not None else chunks)


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def round_of(port, model, clients, per_client, max_tokens):
    """`clients` threads, each sending `per_client` requests one after another."""
    ttft, tokens, errors = [], [], []
    lock = threading.Lock()

    def client(i):
        for j in range(per_client):
            try:
                f, n = one_request(port, model, PROMPTS[(i + j) % len(PROMPTS)], max_tokens)
                with lock:
                    ttft.append(f)
                    tokens.append(n)
            except Exception as e:  # a failed request is reported, not hidden
                with lock:
                    errors.append(str(e))

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"tok_s": sum(tokens) / wall, "p50": percentile(ttft, 0.5), "p95": percentile(ttft, 0.95),
            "requests": len(tokens), "tokens": sum(tokens), "errors": errors}


def run_server(cmd, port, model, args):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        one_request(port, model, PROMPTS[0], 8)  # warm-up
        out = {}
        for c in args.clients:
            out[c] = round_of(port, model, c, args.per_client, args.max_tokens)
            print(f"  {os.path.basename(cmd[0])}: {c} clients done ({out[c]['requests']} requests)", file=sys.stderr)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", required=True, help="the rusting-brain-server binary")
    ap.add_argument("--folder", help="SmolLM2's f32 Hugging Face folder (ours rounds it to int8 at load)")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--gguf", required=True, help="the Q8_0 GGUF of the same weights")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--per-client", type=int, default=2, help="requests each client sends in turn")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=512, help="positions per request")
    ap.add_argument("--same-file", action="store_true",
                    help="ours serves the Q8_0 GGUF too (its blocks as they are), not the folder")
    args = ap.parse_args()
    if not args.same_file and not args.folder:
        ap.error("--folder DIR, or --same-file to serve the GGUF")
    args.clients = [int(c) for c in args.clients.split(",")]
    most = max(args.clients)
    threads = os.cpu_count() or 1
    model, isa = cpu()

    port = free_port()
    source = [args.gguf] if args.same_file else [args.folder, "--q8"]
    ours = run_server([args.ours, "--model", *source, "--name", "smollm2", "--port", str(port),
                       "--max-batch", str(most), "--max-queue", "256", "--context", str(args.context)],
                      port, "smollm2", args)
    port = free_port()
    theirs = run_server([args.llama_server, "-m", args.gguf, "--port", str(port), "-t", str(threads), "-tb",
                         str(threads), "-np", str(most), "-c", str(most * args.context), "--no-webui"],
                        port, "smollm2", args)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"\nSmolLM2-135M-Instruct, int8 (ours) vs Q8_0 (llama.cpp), {threads} threads, greedy, "
          f"{args.max_tokens} tokens a reply, {args.per_client} requests a client")
    print(f"CPU: {model} ({' '.join(isa) or 'no AVX2'}), commit {commit}\n")
    print("| clients | ours tok/s | llama.cpp tok/s | ratio | ours TTFT p50 / p95 (ms) | llama.cpp TTFT p50 / p95 (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c in args.clients:
        a, b = ours[c], theirs[c]
        print(f"| {c} | {a['tok_s']:.1f} | {b['tok_s']:.1f} | {a['tok_s'] / b['tok_s']:.2f}x | "
              f"{a['p50'] * 1e3:.0f} / {a['p95'] * 1e3:.0f} | {b['p50'] * 1e3:.0f} / {b['p95'] * 1e3:.0f} |")
    for name, r in [("ours", ours), ("llama.cpp", theirs)]:
        for c in args.clients:
            if r[c]["errors"]:
                print(f"{name}, {c} clients: {len(r[c]['errors'])} failed requests, first: {r[c]['errors'][0]}")


if __name__ == "__main__":
    main()
