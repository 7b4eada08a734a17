#!/usr/bin/env bash
# The round trip of docs/SCALE_OUT.md on the tiny fixture model, on this machine's CPUs:
# fine-tune here, continue under FSDP2 on 2 ranks (gloo), come back, and check that this
# library's greedy continuation from what PyTorch wrote is transformers' own.
#
#     PYTHON=~/venv-fixtures/bin/python docs/scale_out/roundtrip.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
work="${WORK:-$(mktemp -d)}"
example=(cargo run -q --release -p rusting_brain --example language_model --)
prompt="the model reads"

echo "== 1. fine-tune here, then save_pretrained"
"${example[@]}" train --from-pretrained tests/fixtures/hf_chat/chatml --steps 20 --lr 3e-3 \
    --save-pretrained "$work/here"

echo "== 2. continue in PyTorch: FSDP2 over 2 ranks, save_pretrained from rank 0"
zcat native/examples/data/corpus/heldout.txt.gz | head -c 200000 > "$work/corpus.txt"
torchrun="$(dirname "$PYTHON")/torchrun"
[ -x "$torchrun" ] || torchrun=torchrun
"$torchrun" --standalone --nproc_per_node 2 docs/scale_out/fsdp_finetune.py "$work/here" "$work/torch" \
    --text "$work/corpus.txt" \
    --steps 20 --lr 3e-3 --seq 64 --batch 8 --prompt "$prompt" --new-tokens 16 | tee "$work/torch.log"

echo "== 3. back here: from_pretrained on what PyTorch wrote, greedy"
"${example[@]}" generate "$prompt" --from-pretrained "$work/torch" --temperature 0 \
    --repetition-penalty 1 --tokens 16 --ids | tee "$work/ours.json"

"$PYTHON" - "$work/torch.log" "$work/ours.json" <<'PY'
import json, sys
theirs = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
ours = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert ours["prompt"] == theirs["prompt"], (ours["prompt"], theirs["prompt"])
assert ours["ids"] == theirs["ids"], f"ours {ours['ids']} vs transformers {theirs['ids']}"
print(f"same greedy continuation ({len(ours['ids'])} tokens): {ours['ids']}")
PY
