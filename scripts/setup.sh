#!/usr/bin/env bash
# Everything the project needs on a fresh Debian machine: Chromium and Node (Debian
# packages, only when missing), the Python package in .venv, and onnxruntime-web at the
# version pinned in web/package-lock.json. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
command -v npm >/dev/null || missing+=(nodejs npm)
if ((${#missing[@]})); then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
# openvino: the openvino runtime's and NNCF's INT8 export's tests run here too (OpenVINO's wheel of
# about 60 MB and NNCF's pure-Python one; seconds of tests)
pip install -q -e '.[test,openvino]'
# rliable's metrics module checks the statistics over training seeds in the tests; its bootstrap
# module needs arch, which does not import beside pandas 3, so only the package itself is installed
pip install -q --no-deps rliable==1.2.0
npm ci --prefix web --no-audit --no-fund --loglevel=error
