#!/usr/bin/env bash
# Issue 19's figures on a GPU machine in one run: transformers on the GGUF file (float16, eager
# and torch.compile; bench/smollm2_reference.py), then fusec on the same file (tokens against the
# reference file, speed, a decode step's profile), then fusec with one submit per call
# (FUSEC_SUBMIT_FIRST=0). Each writes JSON and a log into OUT.
#
#     bash bench/smollm2_h100.sh PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf OUT
#
# Where a directory of carried wheels on PYTHONPATH holds a huggingface_hub newer than the
# installed transformers accepts (2.x against <2.0: transformers refuses to import), run the
# reference with only the gguf package added: PYTHONPATH="$PWD:DIR_WITH_GGUF_ALONE".
set -uo pipefail
gguf=${1:?the GGUF file}
out=${2:-.}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 bench/smollm2_reference.py --gguf "$gguf" --bench --device cuda --dtype float16 \
    --compile --out "$out/hf_speed.json" > "$out/hf.log" 2>&1
echo "transformers: rc=$?"
python3 bench/smollm2_bench.py --gguf "$gguf" --check tests/data/smollm2_reference.json --speed \
    --profile --out "$out/fusec.json" > "$out/fusec.log" 2>&1
echo "fusec: rc=$?"
FUSEC_SUBMIT_FIRST=0 python3 bench/smollm2_bench.py --gguf "$gguf" --speed \
    --out "$out/fusec_one_submit.json" > "$out/fusec_one_submit.log" 2>&1
echo "fusec, one submit per call: rc=$?"
