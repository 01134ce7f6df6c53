#!/bin/sh
# run-in-rootfs.sh ROOTFS USER WORKDIR COMMAND [ARGS...]
#
# Runs COMMAND from an image's root filesystem the way a container runtime would for a
# Kubernetes pod with `readOnlyRootFilesystem: true`: in a mount namespace of its own, the
# root filesystem bind-mounted read-only, a fresh tmpfs on /tmp (the pod's emptyDir),
# /proc and /dev, as USER (uid:gid), in WORKDIR. The network is the host's, so the process
# reaches the local Kafka and PostgreSQL. The environment is passed as it is (the caller
# sets the image's ENV). Used by tests/deploy/test_image.py where no OCI runtime can start
# a container (docs/decisions/0031). Needs root; exec all the way down, so the PID the
# caller signals is COMMAND's.
set -eu
exec /usr/bin/unshare --mount --propagation private -- sh -c '
  set -eu
  root=$1 user=$2 workdir=$3
  shift 3
  /bin/mount --bind "$root" "$root"
  /bin/mount -o remount,bind,ro "$root"
  /bin/mount -t tmpfs -o size=64m,mode=1777 tmpfs "$root/tmp"
  /bin/mount -t proc proc "$root/proc"
  /bin/mount --rbind /dev "$root/dev"
  exec /usr/sbin/chroot --userspec="$user" "$root" /usr/bin/env --chdir="$workdir" "$@"
' run-in-rootfs "$@"
