#!/usr/bin/env bash
# The run command: installs what `svcnet up` and the README's walkthrough need at run time (as
# root, on Debian: nftables and libnftables1, iptables, conntrack, iproute2, and curl and dig for the
# walkthrough; protobuf-compiler to build it), then starts `svcnet up` from the repository root, so the default data dir is
# <repository>/svcnet-data. Arguments are passed to `svcnet up` (see `svcnet up --help`).
# SVCNET_BIN=/path/to/svcnet runs that binary instead of building one with cargo (the README
# test does, with the binary it was built with).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pair in nft:nftables iptables-restore:iptables conntrack:conntrack ip:iproute2 curl:curl dig:bind9-dnsutils; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
done
# The nftables mode's proxy loads libnftables at run time (dlopen).
ldconfig -p 2>/dev/null | grep 'libnftables\.so\.1 ' >/dev/null || missing+=(libnftables1)
# `--pod-network bgp` runs BIRD 2 (Debian's bird2) in every node namespace.
case " $* " in
  *" --pod-network bgp "* | *" --pod-network=bgp "*) command -v bird >/dev/null 2>&1 || missing+=(bird2) ;;
esac
# Building svcnet (its default `etcd` feature: etcd-client's generated gRPC code) needs protoc.
[ -n "${SVCNET_BIN:-}" ] || command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "svcnet up needs: ${missing[*]}; run this script as root so it can install them" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ -n "${SVCNET_BIN:-}" ]; then
  exec "$SVCNET_BIN" up "$@"
fi
# The workspace has more than one binary (the agent's test server too): name the one to run.
exec cargo run --release -p svcnet --bin svcnet -- up "$@"
