#!/usr/bin/env python3
"""Whether two GGUF files hold the same tensors, byte for byte: `save_gguf`'s file against
llama.cpp's (`llama-quantize` of the same f32 weights). Prints, per file pair, how many
tensors are byte-identical, which differ (type or bytes), and the metadata keys only one
side has. Needs: pip install gguf numpy.

Usage: python3 bench/gguf_same_bytes.py OURS.gguf THEIRS.gguf [OURS THEIRS ...]
"""

import sys

import numpy as np
from gguf import GGUFReader


def main(paths):
    if len(paths) < 2 or len(paths) % 2:
        sys.exit(__doc__)
    status = 0
    for ours, theirs in zip(paths[::2], paths[1::2]):
        a, b = GGUFReader(ours), GGUFReader(theirs)
        tb = {t.name: t for t in b.tensors}
        same, differ = 0, []
        for t in a.tensors:
            u = tb.get(t.name)
            if u is None:
                differ.append(f"{t.name}: not in {theirs}")
            elif t.tensor_type != u.tensor_type:
                differ.append(f"{t.name}: {t.tensor_type.name} here, {u.tensor_type.name} there")
            elif not np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(u.data).view(np.uint8)):
                differ.append(f"{t.name}: the bytes differ")
            else:
                same += 1
        print(f"{ours} against {theirs}: {same} of {len(a.tensors)} tensors byte-identical "
              f"({len(b.tensors)} there)")
        for d in differ[:10]:
            print("  " + d)
        only_a, only_b = sorted(set(a.fields) - set(b.fields)), sorted(set(b.fields) - set(a.fields))
        print(f"  keys only here: {only_a}\n  keys only there: {only_b}")
        status |= bool(differ) or len(a.tensors) != len(b.tensors)
    sys.exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
