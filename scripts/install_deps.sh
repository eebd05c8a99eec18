#!/usr/bin/env bash
# System packages the tests need: a Vulkan loader and Mesa's software driver (lavapipe) so burn's wgpu backend runs
# on machines without a GPU. Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail

need=()
dpkg -s libvulkan1 >/dev/null 2>&1 || need+=(libvulkan1)
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
# A Python venv for the openai client test (scripts/install_python.sh).
python3 -c "import ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "install_deps: installing ${need[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
