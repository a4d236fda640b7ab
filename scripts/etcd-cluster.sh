#!/usr/bin/env bash
# A local 3-member etcd cluster on loopback for trying `svcnet up --etcd-servers` / `svcnet
# apiserver` on one machine: Debian's etcd (installed when missing, as root), members m1-m3 with
# client URLs http://127.0.0.1:23791-23793 and peer URLs http://127.0.0.1:23801-23803, data in
# $SVCNET_ETCD_DIR (default /tmp/svcnet-etcd; kept across runs, so a restart keeps the data).
# Runs in the foreground; Ctrl-C stops the three members. Plain HTTP on loopback only: a real
# cluster uses TLS (--etcd-cafile/--etcd-certfile/--etcd-keyfile) and etcd >= 3.5.13.
set -euo pipefail

dir="${SVCNET_ETCD_DIR:-/tmp/svcnet-etcd}"
if ! command -v etcd >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "etcd is missing; run this script as root so it can install etcd-server" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq etcd-server etcd-client >/dev/null
fi
mkdir -p "$dir"
cluster="m1=http://127.0.0.1:23801,m2=http://127.0.0.1:23802,m3=http://127.0.0.1:23803"
pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM
for i in 1 2 3; do
  etcd --name "m$i" --data-dir "$dir/m$i" \
    --listen-client-urls "http://127.0.0.1:2379$i" --advertise-client-urls "http://127.0.0.1:2379$i" \
    --listen-peer-urls "http://127.0.0.1:2380$i" --initial-advertise-peer-urls "http://127.0.0.1:2380$i" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token svcnet-local \
    --log-level warn >"$dir/m$i.log" 2>&1 &
  pids+=("$!")
done
endpoints="http://127.0.0.1:23791,http://127.0.0.1:23792,http://127.0.0.1:23793"
for _ in $(seq 100); do
  if ETCDCTL_API=3 etcdctl --endpoints="$endpoints" endpoint health >/dev/null 2>&1; then
    echo "etcd cluster up (logs and data in $dir); try:"
    echo "  svcnet up --etcd-servers $endpoints"
    echo "  svcnet apiserver --listen 127.0.0.1:6444 --etcd-servers $endpoints"
    echo "  ETCDCTL_API=3 etcdctl --endpoints=$endpoints get /registry --prefix --keys-only"
    wait
    exit 0
  fi
  sleep 0.1
done
echo "etcd did not become healthy; see $dir/m*.log" >&2
exit 1
