#!/usr/bin/env bash
# Makes sure the load generator the benchmarks drive (wrk) and taskset are installed:
# as root on Debian it installs them with apt-get; otherwise it says what to install.
set -euo pipefail
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v taskset >/dev/null || missing+=(util-linux)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "bench: please install ${missing[*]} (Debian: apt-get install ${missing[*]})" >&2
  exit 1
fi
