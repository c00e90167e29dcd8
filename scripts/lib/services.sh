# Helpers for scripts that drive scripts/services; sourced (by scripts/test and
# scripts/tests/test_services_detection.sh), it only defines functions.
#
# Why the status is read whole first: `"$SERVICES" status | grep -q "^$svc: *running"` under
# `set -o pipefail` misreads a running service. grep -q exits at its first match, the next
# line `status` writes kills it with SIGPIPE, and the pipeline fails as if nothing had
# matched: a service that runs reads as stopped (and scripts/test then stopped, at its
# exit, the services the user had started).

# service_running_in STATUS SERVICE: the output of `scripts/services status` (STATUS) says
# SERVICE is running. "postgres" is not "postgres13".
service_running_in() {
    grep -q "^$2: *running" <<<"$1"
}

# services_not_running SERVICES SERVICE…: prints, on one line separated by spaces, each
# SERVICE that `SERVICES status` does not report as running (nothing when all run). Fails,
# printing nothing, when `SERVICES status` fails.
services_not_running() {
    local services="$1" status svc
    local not_running=()
    shift
    status="$("$services" status)" || return
    for svc in "$@"; do
        service_running_in "$status" "$svc" || not_running+=("$svc")
    done
    printf '%s\n' "${not_running[*]}"
}
