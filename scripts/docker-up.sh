#!/usr/bin/env bash
# Bring up a local Docker engine and the test image `tangram-test:busybox`, idempotently.
#
# Why this shape: the test and CI machines are fresh Debian boxes with no registry access, so we
# install docker.io + busybox-static from Debian, start dockerd without iptables/bridge (containers
# run with --network none), and build the image with `docker import` from a busybox rootfs.
# Quick when everything is already up: `docker info` + `docker image inspect` and exit.
set -euo pipefail

IMAGE="${TANGRAM_TEST_IMAGE:-tangram-test:busybox}"
LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
WAIT_S="${DOCKERD_WAIT_S:-60}"

log() { echo "docker-up: $*" >&2; }

daemon_ok() { timeout 10 docker info >/dev/null 2>&1; }

need_install() {
    command -v dockerd >/dev/null 2>&1 || return 0
    command -v docker >/dev/null 2>&1 || return 0
    busybox_bin >/dev/null 2>&1 || return 0
    return 1
}

busybox_bin() {
    for b in /bin/busybox /usr/bin/busybox /usr/sbin/busybox; do
        if [ -x "$b" ] && file_is_static "$b"; then echo "$b"; return 0; fi
    done
    return 1
}

# A dynamically linked busybox would not run inside an image that has no libc.
file_is_static() {
    # ldd prints "not a dynamic executable" (exit 1) for static binaries.
    ! ldd "$1" >/dev/null 2>&1
}

if ! daemon_ok; then
    if need_install; then
        if [ "$(id -u)" != 0 ]; then log "need root to install docker.io"; exit 1; fi
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y --no-install-recommends docker.io busybox-static >/dev/null 2>&1; then
            log "apt-get update"
            apt-get update -qq >/dev/null
            apt-get install -y --no-install-recommends docker.io busybox-static >/dev/null
        fi
    fi
    if ! pgrep -x dockerd >/dev/null 2>&1; then
        log "starting dockerd (log: $LOG)"
        # Stale pid/socket files from a killed daemon make dockerd refuse to start.
        rm -f /var/run/docker.pid /var/run/docker.sock
        # ...and so do a dead managed containerd's: its pid file can name a recycled pid, and
        # dockerd then waits forever for a socket nobody serves.
        if ! pgrep -x containerd >/dev/null 2>&1; then
            rm -f /var/run/docker/containerd/containerd.pid /var/run/docker/containerd/containerd.sock \
                /var/run/docker/containerd/containerd-debug.sock
        fi
        # containerd is started by dockerd itself when it is not running.
        nohup dockerd --iptables=false --ip6tables=false --bridge=none >>"$LOG" 2>&1 &
    fi
    deadline=$(( $(date +%s) + WAIT_S ))
    until daemon_ok; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            log "dockerd did not answer within ${WAIT_S}s; last log lines:"
            tail -n 30 "$LOG" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    log "dockerd is up"
fi

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    if ! bb="$(busybox_bin)"; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y --no-install-recommends busybox-static >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null; apt-get install -y --no-install-recommends busybox-static >/dev/null; }
        bb="$(busybox_bin)"
    fi
    root="$(mktemp -d)"
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root/bin" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/etc"
    chmod 1777 "$root/tmp"
    cp "$bb" "$root/bin/busybox"
    for applet in $("$root/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
    done
    echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
    echo "root:x:0:" >"$root/etc/group"
    log "building $IMAGE from $bb"
    tar -C "$root" -c . | docker import \
        --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
fi
log "ready: $(docker version --format '{{.Server.Version}}') image $IMAGE"
