#!/usr/bin/env bash
# A RAM-backed ext4 for benchmarks on a machine whose disk stalls: a loop device over a
# file in /dev/shm, so that write, fsync and the filesystem's journal take the kernel paths
# they take on a disk (an fsync costs about what this machine's disk costs at p50, 0.2 ms)
# without the device's stalls. It is not free: the loop device's copying takes 0.1-0.3 of a
# core under load, which shows in the benches' "other" column. Root only. bench/openloop.py
# runs the bookies' GC between runs, so each bookie keeps its active entry log (up to 1 GiB)
# and the latest runs' data: a ladder to 30,000/s, 3 rounds a rate, peaked at 4.5 GB.
#
#   sudo bench/ramdisk.sh up [DIR] [SIZE]     # default /mnt/zbkbench 12G; prints the TMPDIR to use
#   TMPDIR=/mnt/zbkbench .venv/bin/python bench/openloop.py ...
#   sudo bench/ramdisk.sh down [DIR]
set -euo pipefail
cmd=${1:-}
dir=${2:-/mnt/zbkbench}
img=/dev/shm/$(basename "$dir").img
case "$cmd" in
  up)
    size=${3:-12G}
    truncate -s "$size" "$img"
    mkfs.ext4 -q -F "$img"
    mkdir -p "$dir"
    mount -o loop "$img" "$dir"
    chmod 1777 "$dir"
    echo "TMPDIR=$dir"
    ;;
  down)
    umount "$dir"
    rm -f "$img"
    ;;
  *)
    echo "usage: $0 up [DIR] [SIZE] | down [DIR]" >&2
    exit 2
    ;;
esac
