#!/usr/bin/env bash
# Installs the pinned stack. robosuite goes in without its dependencies: its `mink` pin would pull numpy<2, and
# the packages it really needs are pinned in requirements.txt.
#
# Run as root with apt-get available, it also installs three Debian packages the test suite uses: libosmesa6
# (offscreen rendering of the visual OGBench tasks on a CPU), slurm-wlm and munge (a one-node SLURM cluster for the
# sweep test). `bash scripts/install.sh --no-system` installs the Python packages only.
set -euo pipefail
cd "$(dirname "$0")/.."
SYSTEM=1
for arg in "$@"; do
    case "$arg" in
        --no-system) SYSTEM=0 ;;
        *) echo "usage: bash scripts/install.sh [--no-system]" >&2; exit 2 ;;
    esac
done
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_ROOT_USER_ACTION=ignore  # pip warns on every call when run as root (containers, CI)
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps robosuite==1.5.2

if [ "$SYSTEM" -eq 0 ]; then
    exit 0
fi

# OSMesa lets MuJoCo render the pixel observations of the `visual-*` OGBench tasks on CPU (MUJOCO_GL=osmesa).
# Installed only when missing and only where apt-get can run as root; any failure leaves the install going.
if ! python3 -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("OSMesa") is None)'; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo 'installing libosmesa6 (offscreen rendering for visual OGBench tasks)'
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libosmesa6; } >/dev/null 2>&1; then
            echo 'warning: could not install libosmesa6; visual OGBench tasks need MUJOCO_GL=egl or libosmesa6' >&2
        fi
    else
        echo 'note: libosmesa6 is missing (apt-get install -y libosmesa6 as root) for visual OGBench tasks on CPU' >&2
    fi
fi

# A single-node SLURM (slurm-wlm + munge) for the sweep tests: installed where apt-get runs as root; elsewhere the
# SLURM test fails with the reason (the local-executor sweep test needs nothing extra).
if ! bash scripts/slurm_local.sh install; then
    echo 'warning: SLURM could not be installed; tests/test_sweep.py::test_slurm_sweep_survives_a_preemption will fail' >&2
fi
