#!/usr/bin/env bash
# The container test: crawlq's real image and docker-compose.yml on a real Docker engine.
#
#   bash tests/container/run.sh        (as root; CI runs it as its own step, not in pytest)
#
# 1. starts a Docker engine with ../shared/docker/engine.sh (host networking, no pulls);
# 2. builds the image from Dockerfile on the local debian:bookworm-slim base, and a Redis
#    image from deploy/redis-ci.Dockerfile, through docker-compose.yml + deploy/compose.ci.yml;
# 3. brings up redis + 3 consumer replicas (`up -d --scale consumer=3`), serves a test site
#    on 127.0.0.1 from the host, and runs the producer container on a URL file;
# 4. waits for the crawl to finish: every page done, spread over the replicas, probes and
#    metrics answering;
# 5. a second, slower crawl: one consumer is stopped (SIGTERM, drains, exits 0) and another
#    killed (SIGKILL, its leases expire and are reclaimed) in the middle of it; asserts
#    nothing is lost: done + dead == enqueued, and every URL is in the results volume or a
#    dead letter;
# 6. tears everything down, even on failure (compose down -v, the site, engine.sh down).
#
# Last line: "container test: N passed, M failed"; exit 0 only when nothing failed.
# Environment: CRAWLQ_SHARED (default <repo>/../shared), CRAWLQ_CI_PAGES (default 300).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHARED=${CRAWLQ_SHARED:-$REPO/../shared}
PAGES=${CRAWLQ_CI_PAGES:-300}
SLOW_DELAY=0.5
CRAWL=ci
PROJECT=crawlq-ci-$$
IMAGE=crawlq-ci:local
cd "$REPO"

T0=$SECONDS
passed=0
failed=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/crawlq-container.XXXXXX")
SITE_PID=
ENGINE_UP=0

log() { printf '[container %3ds] %s\n' $((SECONDS - T0)) "$*"; }
pass() { passed=$((passed + 1)); log "ok: $*"; }
fail() { failed=$((failed + 1)); log "FAILED: $*"; exit 1; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

export COMPOSE_PROJECT_NAME=$PROJECT
export CRAWLQ_CRAWL=$CRAWL
export CRAWLQ_CI_DATA=$WORK/data
CRAWLQ_CI_REDIS_PORT=$(free_port)
export CRAWLQ_CI_REDIS_PORT
REDIS_URL=redis://127.0.0.1:$CRAWLQ_CI_REDIS_PORT/0
COMPOSE=(docker compose -f docker-compose.yml -f deploy/compose.ci.yml)

finish() {
  local rc=$?
  set +e
  trap - EXIT
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1
    log "FAILED: aborted (exit $rc) at line ${BASH_LINENO[0]}"
  fi
  if [ "$failed" -ne 0 ] && [ "$ENGINE_UP" = 1 ]; then
    log "diagnostics: compose ps and the last log lines of each service"
    "${COMPOSE[@]}" ps -a 2>&1 | sed 's/^/    /'
    "${COMPOSE[@]}" logs --no-color --tail 25 2>&1 | sed 's/^/    /'
  fi
  if [ "$ENGINE_UP" = 1 ]; then
    "${COMPOSE[@]}" --profile producer down -t 2 --remove-orphans -v >"$WORK/down.log" 2>&1 \
      || { log "compose down failed:"; sed 's/^/    /' "$WORK/down.log"; }
  fi
  [ -n "$SITE_PID" ] && kill "$SITE_PID" 2>/dev/null && wait "$SITE_PID" 2>/dev/null
  if [ "$ENGINE_UP" = 1 ]; then bash "$SHARED/docker/engine.sh" down >/dev/null 2>&1; fi
  rm -rf "$WORK"
  log "took $((SECONDS - T0)) s"
  echo "container test: $passed passed, $failed failed"
  [ "$failed" -eq 0 ] && exit 0
  exit 1
}
trap finish EXIT
trap 'exit 130' INT TERM

# crawlq inside the image, from the host network (the host needs no crawlq install).
cq() {
  docker run --rm --network host -e REDIS_URL="$REDIS_URL" -e CRAWLQ_CRAWL="$CRAWL" \
    "$IMAGE" crawlq "$@"
}

# Print one field of `crawlq stats --json`: pending leased waiting dead done enqueued.
stats_line() {
  cq stats --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
s, c = d["states"], d["counters"]
print(s["pending"], s["leased"], s["waiting"], s["dead"], s["done"], c.get("enqueued", 0))'
}

# Wait until nothing is pending, leased or waiting and done + dead == $1.
wait_finished() {
  local total=$1 deadline=$((SECONDS + $2)) shown=0 line
  while [ "$SECONDS" -lt "$deadline" ]; do
    line=$(stats_line) || line="-1 -1 -1 -1 -1 -1"
    read -r pending leased waiting dead done enqueued <<<"$line"
    if [ "$pending" = 0 ] && [ "$leased" = 0 ] && [ "$waiting" = 0 ] \
        && [ $((done + dead)) -eq "$total" ]; then
      return 0
    fi
    if [ $((SECONDS - shown)) -ge 5 ]; then
      log "  pending $pending leased $leased waiting $waiting dead $dead done $done"
      shown=$SECONDS
    fi
    sleep 1
  done
  log "  timed out: pending $pending leased $leased waiting $waiting dead $dead done $done"
  return 1
}

consumer_ids() { "${COMPOSE[@]}" ps -q consumer; }

# -- 1. engine ----------------------------------------------------------------------------
[ -f "$SHARED/docker/engine.sh" ] \
  || fail "no $SHARED/docker/engine.sh (set CRAWLQ_SHARED to the shared/ folder)"
bash "$SHARED/docker/engine.sh" up >"$WORK/engine.log" 2>&1 \
  || { sed 's/^/    /' "$WORK/engine.log"; fail "engine.sh up"; }
ENGINE_UP=1
pass "docker engine up ($(docker version --format '{{.Server.Version}}'))"

# -- 2. images ----------------------------------------------------------------------------
if ! "${COMPOSE[@]}" --profile producer build >"$WORK/build.log" 2>&1; then
  tail -n 40 "$WORK/build.log" | sed 's/^/    /'
  fail "image build"
fi
python3 - "$(docker image inspect "$IMAGE" --format '{{json .Config}}')" <<'EOF' \
  || fail "image config"
import json
import sys

c = json.loads(sys.argv[1])
problems = []
if c["User"] != "10001:10001":
    problems.append(f"user {c['User']!r}, not 10001:10001")
if c["Cmd"] != ["crawlq-consumer"] or c.get("Entrypoint"):
    problems.append(f"command {c.get('Entrypoint')} {c['Cmd']}, not exec-form crawlq-consumer")
if (c.get("Healthcheck") or {}).get("Test") != ["CMD", "crawlq", "check"]:
    problems.append(f"healthcheck {c.get('Healthcheck')}")
sys.exit("; ".join(problems) or None)
EOF
compilers=$(docker run --rm --network none "$IMAGE" sh -c 'command -v gcc cc c++ make 2>/dev/null || true')
[ -z "$compilers" ] || fail "compilers in the final image: $compilers"
pass "images built: $IMAGE runs as uid 10001, exec-form CMD, HEALTHCHECK crawlq check, no compiler"

# -- 3. stack, site, producer -------------------------------------------------------------
mkdir -p "$WORK/data"
python3 tests/container/site.py --port-file "$WORK/site.port" --delay "$SLOW_DELAY" &
SITE_PID=$!
for _ in $(seq 50); do [ -s "$WORK/site.port" ] && break; sleep 0.1; done
[ -s "$WORK/site.port" ] || fail "test site did not start"
SITE=http://127.0.0.1:$(cat "$WORK/site.port")
for i in $(seq 0 $((PAGES - 1))); do echo "$SITE/p/$i.html"; done >"$WORK/data/fast.txt"
for i in $(seq 0 $((PAGES - 1))); do echo "$SITE/slow/$i.html"; done >"$WORK/data/slow.txt"
chmod 755 "$WORK/data" && chmod 644 "$WORK/data"/*.txt

"${COMPOSE[@]}" up -d --scale consumer=3 >"$WORK/up.log" 2>&1 \
  || { sed 's/^/    /' "$WORK/up.log"; fail "compose up"; }
mapfile -t CONSUMERS < <(consumer_ids)
[ "${#CONSUMERS[@]}" -eq 3 ] || fail "expected 3 consumer containers, got ${#CONSUMERS[@]}"
deadline=$((SECONDS + 60))
while :; do
  health=$(docker inspect -f '{{.State.Health.Status}}' "${CONSUMERS[@]}" | sort -u | tr '\n' ' ')
  [ "$health" = "healthy " ] && break
  [ "$SECONDS" -lt "$deadline" ] || fail "consumers not healthy after 60 s: $health"
  sleep 1
done
pass "redis + 3 consumer replicas up, all healthy (HEALTHCHECK crawlq check)"

# The replicas wait for the crawl to exist: a first run with one URL creates it, and the
# rest comes once every replica works on it (else the first up can finish 300 fast
# pages before the others start, and the spread checked below means nothing).
head -n 1 "$WORK/data/fast.txt" >"$WORK/data/first.txt"
for run in first fast; do
  if ! "${COMPOSE[@]}" run --rm -T producer --json "/data/$run.txt" >"$WORK/producer-$run.json" \
      2>"$WORK/producer-$run.err"; then
    sed 's/^/    /' "$WORK/producer-$run.err"
    fail "producer container (exit non-zero)"
  fi
  [ "$run" = fast ] && break
  deadline=$((SECONDS + 60))
  until [ "$(cq workers --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" \
          -ge 3 ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the 3 replicas did not start on the crawl in 60 s"
    sleep 0.5
  done
done
enqueued=$(python3 -c 'import json,sys; print(sum(json.load(open(f))["enqueued"] for f in sys.argv[1:]))' \
  "$WORK/producer-first.json" "$WORK/producer-fast.json")
[ "$enqueued" -eq "$PAGES" ] || fail "producer enqueued $enqueued, expected $PAGES"
log "producer container enqueued $enqueued URLs"
wait_finished "$PAGES" 120 || fail "first crawl did not finish"
read -r _ _ _ dead done _ <<<"$(stats_line)"
[ "$done" -eq "$PAGES" ] && [ "$dead" -eq 0 ] || fail "first crawl: done $done dead $dead"
busy=$(cq workers --json | python3 -c '
import json, sys
print(sum(1 for w in json.load(sys.stdin) if w["done"] > 0))')
[ "$busy" -ge 2 ] || fail "only $busy consumer(s) did work; expected the crawl spread out"
pass "crawl of $PAGES pages complete: done $done, dead 0, $busy of 3 replicas did work"

# Probes: each replica logged the port its side server took (CRAWLQ_HTTP_PORT=0).
for cid in "${CONSUMERS[@]}"; do
  port=$(docker logs "$cid" 2>&1 | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        rec = json.loads(line)
    except ValueError:
        continue
    if isinstance(rec, dict) and "port" in rec and "http_listening" in json.dumps(rec):
        print(rec["port"])
        break')
  [ -n "$port" ] || fail "consumer ${cid:0:12} logged no http_listening port"
  python3 - "$port" <<'EOF' || fail "probes of consumer ${cid:0:12} on port $port"
import sys
import urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"
for path, expect in (("/healthz", "ok"), ("/readyz", "ready"), ("/metrics", "crawlq_")):
    with urllib.request.urlopen(base + path, timeout=5) as resp:
        body = resp.read().decode()
        assert resp.status == 200 and expect in body, (path, resp.status, body[:200])
EOF
done
pass "every replica answers /healthz, /readyz and /metrics on its own port"

# -- 4. a slower crawl with one consumer stopped and one killed mid-way ---------------------
TOTAL=$((2 * PAGES))
"${COMPOSE[@]}" run --rm -T producer --json /data/slow.txt >"$WORK/producer2.json" \
  2>"$WORK/producer2.err" || { sed 's/^/    /' "$WORK/producer2.err"; fail "second producer run"; }
deadline=$((SECONDS + 60))
while :; do
  read -r _ _ _ _ done _ <<<"$(stats_line)"
  [ "$done" -ge $((PAGES + PAGES / 10)) ] && break
  [ "$SECONDS" -lt "$deadline" ] || fail "second crawl made no progress (done $done)"
  sleep 0.5
done
STOPPED=${CONSUMERS[0]}
KILLED=${CONSUMERS[1]}
t=$SECONDS
docker stop -t 15 "$STOPPED" >/dev/null
took=$((SECONDS - t))
code=$(docker inspect -f '{{.State.ExitCode}}' "$STOPPED")
[ "$code" = 0 ] || fail "stopped consumer exited $code, expected 0 (graceful drain)"
# Into a file first: under pipefail, `docker logs | grep -q` fails when grep stops reading
# before docker has written the lines after the match.
docker logs "$STOPPED" >"$WORK/stopped.log" 2>&1
grep -q consumer_draining "$WORK/stopped.log" \
  || fail "stopped consumer logged no consumer_draining (did SIGTERM reach Python?)"
docker kill -s KILL "$KILLED" >/dev/null
sleep 1
killed_state=$(docker inspect -f '{{.State.Status}} exit {{.State.ExitCode}}' "$KILLED")
[ "$killed_state" = "exited exit 137" ] || fail "killed consumer: $killed_state"
read -r pending leased waiting _ done _ <<<"$(stats_line)"
active=$((pending + leased + waiting))
[ "$active" -gt 0 ] || fail "the crawl was already over when consumers were stopped"
log "mid-crawl: stopped ${STOPPED:0:12} (drained, exit 0 in ${took}s), killed ${KILLED:0:12}; $active tasks still to do"
pass "SIGTERM drains a replica (exit 0 within stop_grace_period), SIGKILL of another mid-crawl"

wait_finished "$TOTAL" 180 || fail "second crawl did not finish after losing 2 of 3 consumers"
read -r _ _ _ dead done enqueued <<<"$(stats_line)"
[ "$enqueued" -eq "$TOTAL" ] || fail "enqueued counter $enqueued, expected $TOTAL"
[ $((done + dead)) -eq "$enqueued" ] || fail "done $done + dead $dead != enqueued $enqueued"

# Every URL is in the results volume or is a dead letter.
cq dead ls --json --limit 100000 >"$WORK/dead.json"
docker run --rm --network none -v "${PROJECT}_results:/output:ro" "$IMAGE" python3 -c '
import glob, json, sys
seen, bad = {}, 0
for name in glob.glob("/output/*.jsonl"):
    with open(name, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                bad += 1
                continue
            seen[rec["url"]] = seen.get(rec["url"], 0) + 1
json.dump({"seen": seen, "bad_lines": bad}, sys.stdout)' >"$WORK/results.json" \
  || fail "reading the results volume"
python3 - "$WORK" "$SITE" "$PAGES" <<'EOF' || fail "URLs missing from results"
import json
import sys
from pathlib import Path

work, site, pages = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
expected = {f"{site}/{kind}/{i}.html" for kind in ("p", "slow") for i in range(pages)}
results = json.loads((work / "results.json").read_text())
seen = results["seen"]
dead = {d["url"] for d in json.loads((work / "dead.json").read_text())}
missing = expected - set(seen) - dead
extra = set(seen) - expected
dups = sum(n - 1 for n in seen.values() if n > 1)
print(f"    results: {len(seen)} distinct URLs, {dups} written more than once "
      f"(at-least-once), {len(dead)} dead, {results['bad_lines']} torn lines")
if missing or extra:
    sys.exit(f"missing {sorted(missing)[:5]} ({len(missing)}), unexpected {sorted(extra)[:5]}")
EOF
pass "nothing lost: done $done + dead $dead == enqueued $enqueued, every URL in results or dead"
