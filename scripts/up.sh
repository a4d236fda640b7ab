#!/usr/bin/env bash
# The run command: installs what `svcnet up` needs at run time (as root, on Debian), then starts it.
# Arguments are passed to `svcnet up` (see `svcnet up --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pair in nft:nftables iptables-restore:iptables conntrack:conntrack ip:iproute2; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "svcnet up needs: ${missing[*]}; run this script as root so it can install them" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
exec cargo run --release -- up "$@"
