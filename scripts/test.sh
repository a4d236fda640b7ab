#!/usr/bin/env bash
# The one test command: installs what the tests need (Debian packages, as root) and runs every tier:
# formatting, lints, unit/data-driven tests, privileged network-namespace tests and end-to-end tests
# with the real kubectl and dig.
set -euo pipefail
cd "$(dirname "$0")/.."

need=(nft iptables-restore conntrack ip ss dig curl script pgrep linux.uml modprobe ipset ipvsadm protoc etcd etcdctl bird birdc
  qemu-system-x86_64 busybox dpkg-deb)
missing=()
for bin in "${need[@]}"; do command -v "$bin" >/dev/null 2>&1 || missing+=("$bin"); done
# The nftables dataplane loads libnftables at run time (dlopen, no headers needed to build).
ldconfig -p 2>/dev/null | grep 'libnftables\.so\.1 ' >/dev/null || missing+=(libnftables.so.1)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing tools: ${missing[*]}; run as root so they can be installed" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # user-mode-linux (+ kmod for its modules): the kernel-matrix tier below; ipset, ipvsadm: what
  # the IPVS dataplane's tests compare against; protobuf-compiler: etcd-client's build (the
  # default `etcd` feature); etcd-server, etcd-client: the store's etcd conformance tests; bird2:
  # the BGP speaker of `--pod-network bgp` (svcnet runs its own per node namespace; the package's
  # bird.service is not used); qemu-system-x86, busybox-static: the QEMU tier below (Debian's
  # own kernel, unpacked by scripts/vm/image).
  apt-get install -y -qq nftables libnftables1 iptables conntrack iproute2 bind9-dnsutils curl util-linux procps \
    user-mode-linux kmod ipset ipvsadm protobuf-compiler etcd-server etcd-client bird2 \
    qemu-system-x86 busybox-static >/dev/null
fi
# The etcd tests fail (instead of skipping) when the etcd binary is missing.
export SVCNET_REQUIRE_ETCD=1

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The userspace proxy's portable path (unprivileged, tokio, no namespaces) must build for macOS.
# Only the Rust standard library for the target is needed (no C toolchain: the crate and its
# dependencies are pure Rust); the svcnet binary itself needs ring's C code and is not checked.
mac=x86_64-apple-darwin
if rustup target list --installed 2>/dev/null | grep -qx "$mac" || rustup target add "$mac" >/dev/null 2>&1; then
  cargo clippy -p svcnet-userspace --target "$mac" --all-targets -- -D warnings
else
  echo "WARNING: could not install the $mac standard library; the macOS build check did not run" >&2
fi
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi

# The QEMU tier: Debian's own kernel (scripts/vm/), for what needs nf_tables for ip with ip_vs
# or ipip, which neither this host's kernel (no ip_vs, no ipip) nor user-mode Linux (no
# nf_tables for ip/ip6/inet) has: upstream's NetworkPolicy cases in network namespaces under
# the IPVS proxy, and across nodes over Calico's IPIP. SVCNET_VM=1 makes a test that is not
# inside it fail instead of skipping. Its CPUs are emulated (~80x slower here), so `svcnet up`
# with a policy end to end (--proxy-mode ipvs, ~5 min; --pod-network ipip across two nodes)
# runs only with SVCNET_VM_E2E=1.
#
# The tiers run the test binaries the workspace build above made, through the tiers' cargo
# runners, in their crate's directory as cargo would: `cargo test -p <crate>` would resolve
# features for that crate alone and build its dependencies again (minutes in CI).
workspace_tests=$(cargo test --workspace --no-run --message-format=json)
# tier <runner> <crate dir> <test target> [test filter...]
tier() {
  local runner=$1 rel=$2 target=$3 dir=$PWD/$2 bin
  shift 3
  # The manifest's path ends with the crate's directory (cargo prints it as the physical
  # path, which $PWD need not be when the checkout is reached through a symlink).
  bin=$(printf '%s\n' "$workspace_tests" | grep -F "/$rel/Cargo.toml\"," |
    grep -F '"kind":["test"]' | grep -F "\"name\":\"$target\"" |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | head -n 1)
  if [ -z "$bin" ]; then
    echo "no test binary $target of $rel in the workspace build" >&2
    return 1
  fi
  echo "tier: $(basename "$(dirname "$runner")") $rel --test $target $*"
  (cd "$dir" && "$runner" "$bin" "$@")
}
vm() { SVCNET_VM=1 tier "$PWD/scripts/vm/cargo-runner" "$@"; }
# One boot: NetworkPolicy under the IPVS proxy, and across nodes over Calico's IPIP.
vm crates/netpol-nft kernel ipvs_ ipip_
if [ "${SVCNET_VM_E2E:-}" = 1 ]; then
  vm crates/svcnet e2e_netpol ipvs_
  vm crates/svcnet e2e_netpol_nodes ipip_
fi

# The kernel-matrix tier: test binaries that need what this host's kernel may lack (ip_vs,
# dummy, a kernel without nf_tables for ip/ip6) run inside user-mode Linux (Debian's 6.1), one
# boot per binary, through a cargo runner (scripts/uml/). SVCNET_UML=1 makes a test that is
# not inside UML fail instead of skipping; a UML that cannot start fails the run (no result
# file is a failure, never a pass).
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null && [ "${SVCNET_UML_AMX:-}" != shim ]; then
  # User-mode Linux 6.1 cannot boot on a CPU with AMX (scripts/uml/noxstate.c says why). The
  # shim that boots it keeps only x87/SSE state for guest tasks, so AVX code in the guest may
  # go wrong: not a tier to let decide a run. Said as loudly as a failure, once.
  cat >&2 <<'NOTE'
################################################################################################
# KERNEL-MATRIX TIER NOT RUN: this host CPU has AMX, and Debian's user-mode Linux (6.1) panics
# at boot on it ("ptrace set fp regs failed, errno = 14"). IPVS, legacy iptables in a second
# kernel, Calico's IPIP pod network and the seeds' walkthrough in IPVS mode were not tested in
# this run. To run the tier here anyway: SVCNET_UML_AMX=shim ./scripts/test.sh (FXSAVE-only
# FPU state in the guest).
################################################################################################
NOTE
  exit 0
fi
uml() { SVCNET_UML=1 tier "$PWD/scripts/uml/cargo-runner" "$@"; }
uml crates/iptables uml
uml crates/ipvs uml
uml crates/proxyd e2e ipvs_
# Calico's IPIP pod network (this host's kernel has no `ipip`; UML's has the module).
uml crates/agent uml_ipip
# The userspace dataplane's data path (unprivileged mode: frontends bound directly, no kernel
# rules) on the second kernel; its privileged redirect table is nftables, which that kernel
# lacks for ip/ip6.
uml crates/userspace unprivileged
# The seeds' walkthrough in IPVS mode in one more boot (svcnet up --nodes 2, examples/myapp.yaml,
# curl from the host and from a pod, svcnet trace, dig; each step checked; about a minute), with
# the svcnet binary of the workspace build (svcnet's integration tests need it, so it is there).
scripts/uml/walkthrough ipvs
