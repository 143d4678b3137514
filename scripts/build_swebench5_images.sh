#!/usr/bin/env bash
# Build the instance images of the SWE-bench 5 task repo examples/tasks/swebench5 (real bugs from real PyPI
# releases), laid out like SWE-bench's official images, with no registry. Idempotent and cached:
#  - each task's Dockerfile names its release sdist (`# polar-sdist: NAME==VERSION`) and the env's wheels
#    (`# polar-wheels: A==1 B==2 ...`); they are downloaded once, on the host, with its pip, into
#    $POLAR_CACHE/swebench5/{sdists,wheels} (a second run downloads nothing);
#  - every task image starts FROM the common base (base/Dockerfile: the conda stand-in, testbed-from-sdist), built
#    first; the build context is the task directory plus sdist/ and wheels/ staged from that cache;
#  - an image whose `nemo_polar.dockerfile` label matches the digest of its Dockerfile (with the base's, and its
#    repo_files/) is skipped;
#  - after a build, /testbed's HEAD must be task.yaml's base_commit (the commit is deterministic).
# With --verify, each image is then graded twice in fresh containers (--network none) with swebench's own
# TestSpec (make_test_spec: the eval script swebench would run) and get_eval_report: with no patch it must not
# resolve (every FAIL_TO_PASS failing, every PASS_TO_PASS passing); with gold.patch applied it must resolve.
# Usage: scripts/build_swebench5_images.sh [--verify] [INSTANCE_ID ...]    (default: every task)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TASKS=${SWEBENCH5_TASKS:-$ROOT/examples/tasks/swebench5}/tasks
CACHE=${POLAR_CACHE:-$HOME/.cache/nemo_polar}/swebench5
RUNTIME_BASE=${SWEBENCH5_BASE:-nemo-polar/runtime:1}
BASE_DIR=$TASKS/../base
BASE=nemo-polar/sweb.base.x86_64:1  # the tasks' common base (base/Dockerfile): conda stand-in, testbed-from-sdist
PIP=${PIP:-python3 -m pip}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
verify=0
if [ "${1:-}" = --verify ]; then verify=1; shift; fi
mkdir -p "$CACHE/sdists" "$CACHE/wheels" "$CACHE/logs"

docker info >/dev/null 2>&1 || { echo "no docker daemon answers: run scripts/setup_docker.sh" >&2; exit 1; }
docker image inspect "$RUNTIME_BASE" >/dev/null 2>&1 || bash "$ROOT/scripts/setup_docker.sh"

# The common base first; every task image's digest includes it, so a changed base rebuilds them all.
base_digest=$(sha256sum <"$BASE_DIR/Dockerfile" | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "nemo_polar.dockerfile"}}' "$BASE" 2>/dev/null || true)" \
    != "$base_digest" ]; then
  echo "building $BASE"
  # --network host: apt needs the Debian mirror; the image's containers run with no network at all.
  docker build --network host --build-arg "BASE=$RUNTIME_BASE" --label "nemo_polar.dockerfile=$base_digest" \
    -t "$BASE" "$BASE_DIR" >"$CACHE/logs/base.build.log" 2>&1 ||
    { tail -30 "$CACHE/logs/base.build.log" >&2; echo "build of $BASE failed" >&2; exit 1; }
fi

# The file in DIR that is the distribution NAME==VERSION (sdist or wheel), by normalized name; empty if none.
find_dist() { # DIR NAME==VERSION KIND(sdist|wheel)
  python3 - "$@" <<'EOF'
import os, re, sys
d, spec, kind = sys.argv[1:]
name, version = spec.split("==")
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
for f in sorted(os.listdir(d)):
    if kind == "sdist" and f.endswith(".tar.gz"):
        stem = f[: -len(".tar.gz")]
    elif kind == "wheel" and f.endswith(".whl"):
        stem = "-".join(f.split("-")[:2])
    else:
        continue
    n, _, v = stem.rpartition("-")
    if norm(n) == norm(name) and v == version:
        print(os.path.join(d, f))
        break
EOF
}

header() { # DOCKERFILE KEY: the value of its `# KEY:` line
  sed -n "s/^# $2: *//p" "$1" | head -1
}

fetch() { # NAME==VERSION KIND: the cached file, downloaded on first use
  local found
  found=$(find_dist "$CACHE/${2}s" "$1" "$2")
  if [ -z "$found" ]; then
    echo "  download $1 ($2)" >&2
    if [ "$2" = sdist ]; then
      $PIP download -q --no-deps --no-binary :all: -d "$CACHE/sdists" "$1" >>"$CACHE/logs/pip.log" 2>&1
    else
      $PIP download -q --no-deps --only-binary :all: --python-version 3.11 --implementation cp --abi cp311 \
        --platform manylinux2014_x86_64 -d "$CACHE/wheels" "$1" >>"$CACHE/logs/pip.log" 2>&1
    fi || { tail -5 "$CACHE/logs/pip.log" >&2; exit 1; }
    found=$(find_dist "$CACHE/${2}s" "$1" "$2")
    [ -n "$found" ] || { echo "pip download $1 left no $2 in $CACHE/${2}s" >&2; exit 1; }
  fi
  echo "$found"
}

if [ $# -gt 0 ]; then ids=("$@"); else ids=(); for d in "$TASKS"/*/; do ids+=("$(basename "$d")"); done; fi
built_any=0
context=
trap 'rm -rf "$context"' EXIT
for id in "${ids[@]}"; do
  dir=$TASKS/$id
  [ -f "$dir/task.yaml" ] && [ -f "$dir/Dockerfile" ] || { echo "$id: no task.yaml/Dockerfile in $dir" >&2; exit 1; }
  image=$(sed -n 's/^image: *//p' "$dir/task.yaml")
  base_commit=$(sed -n 's/^base_commit: *//p' "$dir/task.yaml")
  # the Dockerfile and what it COPYs from the task directory (repo_files/: files the sdist leaves out)
  digest=$( (echo "$base_digest"; cat "$dir/Dockerfile"
    if [ -d "$dir/repo_files" ]; then (cd "$dir" && find repo_files -type f | LC_ALL=C sort | xargs sha256sum); fi
  ) | sha256sum | cut -c1-16)
  have=$(docker image inspect -f '{{index .Config.Labels "nemo_polar.dockerfile"}}' "$image" 2>/dev/null || true)
  if [ "$have" = "$digest" ]; then
    echo "up to date: $image"
    continue
  fi
  start=$(date +%s)
  echo "building $image"
  context=$(mktemp -d)
  cp -r "$dir"/. "$context"/
  mkdir -p "$context/sdist" "$context/wheels"
  sdist=$(header "$dir/Dockerfile" polar-sdist)
  [ -n "$sdist" ] || { echo "$dir/Dockerfile has no '# polar-sdist:' line" >&2; exit 1; }
  cp "$(fetch "$sdist" sdist)" "$context/sdist/"
  for w in $(header "$dir/Dockerfile" polar-wheels); do
    cp "$(fetch "$w" wheel)" "$context/wheels/"
  done
  log=$CACHE/logs/$id.build.log
  # --network host: apt needs the Debian mirror; the image's containers run with no network at all.
  if ! docker build --network host --build-arg "BASE=$BASE" --label "nemo_polar.dockerfile=$digest" \
      -t "$image" "$context" >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "build of $image failed; log: $log" >&2
    exit 1
  fi
  rm -rf "$context"
  head=$(docker run --rm --network none "$image" git -C /testbed rev-parse HEAD)
  if [ "$head" != "$base_commit" ]; then
    echo "$image: /testbed HEAD is $head but $dir/task.yaml says base_commit $base_commit" >&2
    exit 1
  fi
  size=$(docker image inspect -f '{{.Size}}' "$image")
  echo "built $image in $(($(date +%s) - start)) s ($((size / 1000000)) MB, base_commit $head)"
  built_any=1
done
[ "$built_any" = 1 ] || echo "all ${#ids[@]} swebench5 images up to date"
[ "$verify" = 1 ] || exit 0

dirs=()
for id in "${ids[@]}"; do dirs+=("$TASKS/$id"); done
"$PYTHON" - "${dirs[@]}" <<'PY'
import pathlib, subprocess, sys, tempfile, time

from swebench.harness.grading import get_eval_report, get_logs_eval
from swebench.harness.utils import make_test_spec
from swebench.task.repo import load_task

ok = True
for task_dir in sys.argv[1:]:
    instance = load_task(task_dir)
    spec = make_test_spec(instance)
    for name, patch in (("no patch", ""), ("gold", instance["patch"])):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            (tmp / "eval.sh").write_text(spec.eval_script)
            (tmp / "patch.diff").write_text(patch)
            apply = "git apply -v /polar/patch.diff && " if patch else ""
            start = time.time()
            run = subprocess.run(
                ["docker", "run", "--rm", "--network", "none", "-v", f"{tmp}:/polar:ro", spec.image,
                 "bash", "-c", f"cd /testbed && {apply}/bin/bash /polar/eval.sh"],
                capture_output=True, text=True)
            log = tmp / "test_output.txt"
            log.write_text(run.stdout + run.stderr)
            status_map, _ = get_logs_eval(spec, str(log))
            pred = {"instance_id": spec.instance_id, "model_patch": patch}
            report = get_eval_report(spec, pred, str(log), include_tests_status=True)[spec.instance_id]
            tests = report.get("tests_status", {})
            f2p = tests.get("FAIL_TO_PASS", {"success": [], "failure": []})
            p2p = tests.get("PASS_TO_PASS", {"success": [], "failure": []})
            if patch:
                good = report["resolved"]
            else:
                good = bool(status_map) and not report["resolved"] and not f2p["success"] and not p2p["failure"]
            ok &= good
            print(f"{spec.instance_id:36s} {name:8s} resolved={report['resolved']!s:5s} "
                  f"F2P {len(f2p['success'])}/{len(f2p['success']) + len(f2p['failure'])} pass, "
                  f"P2P {len(p2p['success'])}/{len(p2p['success']) + len(p2p['failure'])} pass, "
                  f"{len(status_map)} tests parsed, {time.time() - start:.0f} s  {'ok' if good else 'UNEXPECTED'}")
            if not good:
                print((run.stdout + run.stderr)[-4000:])
sys.exit(0 if ok else 1)
PY
