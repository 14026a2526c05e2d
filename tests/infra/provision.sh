#!/usr/bin/env bash
# Provision what the docker-marked tests need on a Debian-like machine, as root:
# the Docker engine, Debian's distribution registry, mmdebstrap, htpasswd and docker-compose
# (the exported compose.yaml is brought up by it).
# Idempotent: installs only what is missing and starts dockerd only when no engine answers.
# It never skips silently: anything it cannot do ends it with one line and a non-zero exit.
#
# Knobs (environment):
#   PATCHSET_DOCKERD_TIMEOUT         seconds to wait for a started dockerd (default 60)
#   PATCHSET_DOCKERD_STORAGE_DRIVER  dockerd --storage-driver (default overlay2)
#   PATCHSET_DOCKERD_LOG             dockerd's log file (default /tmp/patchset-dockerd.log)
set -euo pipefail

me="tests/infra/provision.sh"
packages=(docker.io docker-registry mmdebstrap apache2-utils docker-compose bubblewrap)
timeout="${PATCHSET_DOCKERD_TIMEOUT:-60}"
driver="${PATCHSET_DOCKERD_STORAGE_DRIVER:-overlay2}"
log="${PATCHSET_DOCKERD_LOG:-/tmp/patchset-dockerd.log}"

fail() {
    echo "$me: $*" >&2
    exit 1
}

engine_answers() {
    command -v docker >/dev/null 2>&1 && docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

if [[ "$(id -u)" -ne 0 ]]; then
    fail "must run as root to install ${packages[*]} and start dockerd (running as $(id -un))"
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
    fail "needs apt-get and dpkg-query (a Debian-like machine) to install ${packages[*]}"
fi
command -v flock >/dev/null 2>&1 || fail "needs flock (util-linux) to serialise concurrent runs"

# Concurrent test sessions may provision at the same time: one at a time.
exec 9>/tmp/patchset-provision.lock
flock -w 900 9 || fail "another provision.sh held /tmp/patchset-provision.lock for 900 s"

missing=()
for pkg in "${packages[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
    [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "$me: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q ||
        fail "apt-get update failed; cannot install ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}" ||
        fail "apt-get install ${missing[*]} failed"
fi
for tool in dockerd docker docker-registry mmdebstrap htpasswd; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is not on PATH after installing ${packages[*]}"
done

if engine_answers; then
    exit 0
fi

if [[ -n "${DOCKER_HOST:-}" && "${DOCKER_HOST}" != "unix:///var/run/docker.sock" ]]; then
    fail "no Docker engine answers at DOCKER_HOST=${DOCKER_HOST}; this script only starts a local dockerd"
fi

if pgrep -x dockerd >/dev/null 2>&1; then
    echo "$me: dockerd is running but not answering yet; waiting up to ${timeout}s"
else
    # A pid file left by a dockerd that died keeps a new one from starting.
    if [[ -f /var/run/docker.pid ]] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
        rm -f /var/run/docker.pid
    fi
    echo "$me: starting dockerd (storage driver $driver, log $log)"
    # setsid: dockerd must outlive this script and the test session that ran it;
    # 9>&-: it must not inherit (and so hold forever) the provisioning lock.
    setsid dockerd --storage-driver="$driver" >>"$log" 2>&1 </dev/null 9>&- &
    disown
fi

deadline=$((SECONDS + timeout))
until engine_answers; do
    if ((SECONDS >= deadline)); then
        tail -n 15 "$log" >&2 2>/dev/null || true
        fail "dockerd did not answer within ${timeout}s; see $log (last lines above)"
    fi
    if ! pgrep -x dockerd >/dev/null 2>&1; then
        tail -n 15 "$log" >&2 2>/dev/null || true
        fail "dockerd exited during start-up; see $log (last lines above)"
    fi
    sleep 1
done
echo "$me: Docker engine $(docker version --format '{{.Server.Version}}') is up"
