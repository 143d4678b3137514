#!/usr/bin/env bash
# System packages: bubblewrap (the default sandbox), socat (the relay to the proxy), git, python3-venv (the Python
# harnesses' venvs); and, unless called with
# `demo` (what `make demo` needs is only those), chromium (report test) and for bwrap over docker images without a
# docker daemon: skopeo + umoci (image -> rootfs), squashfs-tools (an Apptainer SIF image -> rootfs) and patchelf
# (also there: the host's socat and node made to run on any image's libc).
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v socat >/dev/null || missing+=(socat)
command -v git >/dev/null || missing+=(git)
# Python harnesses (mini-swe-agent) get a venv made from the system's python3, the one every sandbox sees.
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
# The OpenHands SDK harness: its Python 3.12 is copied into its install with relative run paths (patchelf); its
# terminal tool runs commands in tmux.
command -v patchelf >/dev/null || missing+=(patchelf)
command -v tmux >/dev/null || missing+=(tmux)
if [ "${1:-all}" != demo ]; then
  command -v chromium >/dev/null || missing+=(chromium)  # renders `polar view` reports in the headless browser test
  command -v skopeo >/dev/null || missing+=(skopeo)
  command -v umoci >/dev/null || missing+=(umoci)
  command -v unsquashfs >/dev/null || missing+=(squashfs-tools)  # Apptainer SIF images (their root is a squashfs)
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present (cached)"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "nemo_polar needs: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "system packages: installed ${missing[*]}"
