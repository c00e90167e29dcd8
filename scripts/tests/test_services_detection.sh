#!/usr/bin/env bash
# scripts/test's detection of the services already running (scripts/lib/services.sh), run
# by scripts/test before anything else; no services, well under a second.
#
# The fake `status` below prints postgres's line and then more than a pipe holds, so a
# reader that stops at its first match (grep -q) makes it die of SIGPIPE while it writes:
# under pipefail the old `status | grep -q` took postgres for stopped, and scripts/test
# stopped it at its exit. The detection must say "running".
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../lib/services.sh
. "$ROOT/scripts/lib/services.sh"

failures=0
fail() { printf '[test_services_detection] FAIL: %s\n' "$*" >&2; failures=$((failures + 1)); }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# As scripts/services prints it (printf '%-9s running …'), with ~250 KiB of detail lines
# after the first line: more than a pipe's 64 KiB buffer.
fake="$tmp/services"
cat >"$fake" <<'FAKE'
#!/usr/bin/env bash
set -euo pipefail
[ "${1:-}" = status ] || exit 2
echo "postgres: running  pid=101  127.0.0.1:25432  data=/x/postgres/data  log=/x/postgres.log"
printf '          detail %s\n' {1..12000}
echo "postgres13: stopped  (127.0.0.1:25413, data=/x/postgres13/data)"
echo "postgres18: running  pid=102  127.0.0.1:25418  data=/x/postgres18/data  log=/x/pg18.log"
echo "mariadb:  running  pid=103  127.0.0.1:23306  data=/x/mariadb/data  log=/x/mariadb.log"
echo "kafka:    stopped  (127.0.0.1:29092, data=/x/kafka/data)"
echo "toxiproxy: running  pid=104  127.0.0.1:28474  version=v2.12.0  log=/x/toxiproxy.log"
FAKE
chmod +x "$fake"

# The fake reproduces the bug: the old pattern misreads postgres (else this test proves
# nothing).
if "$fake" status | grep -q "^postgres: *running"; then
    fail "the fake status did not die of SIGPIPE under grep -q: it reproduces nothing"
fi

# The detection scripts/test uses.
got="$(services_not_running "$fake" postgres mariadb kafka toxiproxy postgres18 postgres13)" \
    || fail "services_not_running failed"
[ "$got" = "kafka postgres13" ] \
    || fail "services_not_running: '$got', want 'kafka postgres13' (postgres, mariadb, toxiproxy and postgres18 run)"

# All running: nothing printed.
got="$(services_not_running "$fake" postgres mariadb)" || fail "services_not_running failed"
[ -z "$got" ] || fail "services_not_running with all running: '$got', want nothing"

# A failing `status` is an error, not "all stopped".
broken="$tmp/broken"
printf '#!/bin/sh\necho "postgres: running"\nexit 3\n' >"$broken"
chmod +x "$broken"
if got="$(services_not_running "$broken" postgres)"; then
    fail "services_not_running succeeded ('$got') although status failed"
fi

# The line's service name is matched whole.
status="$("$fake" status)"
service_running_in "$status" postgres || fail "postgres is running"
service_running_in "$status" postgres18 || fail "postgres18 is running"
! service_running_in "$status" postgres13 || fail "postgres13 is stopped"
! service_running_in "$status" kafka || fail "kafka is stopped"
service_running_in "$status" toxiproxy || fail "toxiproxy is running (its name is wider than the column)"
! service_running_in "$status" postgres1 || fail "postgres1 is no service"
! service_running_in "$status" "" || fail "the empty name is no service"

# No script that starts or checks services reads a command's output through `| grep -q`
# (comments aside).
for script in test demo bench services; do
    if grep -nE '^[^#]*\|[[:space:]]*grep[[:space:]]+(-[a-zA-Z]*q|--quiet)' "$ROOT/scripts/$script" >&2; then
        fail "scripts/$script pipes into grep -q (above): under pipefail the writer may die of SIGPIPE"
    fi
done

if [ "$failures" -gt 0 ]; then
    printf '[test_services_detection] %d failure(s)\n' "$failures" >&2
    exit 1
fi
echo "[test_services_detection] ok" >&2
