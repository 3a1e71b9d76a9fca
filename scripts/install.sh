#!/usr/bin/env bash
# Installs the pinned stack. robosuite goes in without its dependencies: its `mink` pin would pull numpy<2, and
# the packages it really needs are pinned in requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps robosuite==1.5.2
