#!/usr/bin/env bash
# Installs what building and testing kite needs on Debian 12 / Ubuntu, when something is missing.
# The CUDA toolkit is optional: with nvcc at /usr/local/cuda/bin the CUDA backend is built too.
set -euo pipefail
packages=(cmake make gcc g++ pkg-config libpcre2-dev libutf8proc-dev libjansson-dev libevent-dev python3 clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
echo "installing: ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  sudo apt-get update -qq
  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
