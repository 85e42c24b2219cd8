#!/usr/bin/env bash
# Starts a three-node tierkv cluster on 127.0.0.1 (fs store under ./data/),
# waits for a leader, prints the endpoints and example commands, and stops
# all three cleanly (SIGTERM, then wait) on Ctrl-C or when one node dies.
#
# Ctrl-C: the terminal sends SIGINT to its whole foreground process group.
# Had make been in that group, it would die of the SIGINT after this script
# exits 0 (GNU make re-raises a fatal signal) and the shell would show
# $? = 130. So when this script runs in the terminal's foreground group, it
# runs itself again as a job of its own (set -m: a process group of its own,
# given the terminal while it runs, the terminal given back when it ends):
# Ctrl-C reaches only that copy, not make nor the shell above it. The nodes
# run in their own sessions (setsid), out of reach too. The copy's trap stops
# them with SIGTERM, says so in one line and exits 0, and so do this script
# and make (tests/integration/ctrl_c_test.py types Ctrl-C into a pty, to the
# script alone and to `make run`).
#
# The raft ports are authenticated: on first start the script makes a cluster
# token (32 random bytes as hex) in $data/peer-token, mode 0600 (made under
# umask 077 in a temporary file of the same directory, then linked into
# place), keeps it across runs (an existing one is reused; if it is open to
# group or others it is made 0600 again, as tierkvd refuses such a file), and
# gives it to every node with --peer-token-file. Without it any local process
# could act as a member on the loopback raft ports.
#
# The client's endpoints: the script writes the three nodes' HTTP addresses
# to $data/endpoints (one line, comma-separated). With the default data
# directory that is ./data/endpoints, which `tierkv` reads when it is given
# neither -e/--endpoints nor TIERKV_ENDPOINTS (docs/cli.md): after make run,
# `tierkv get greeting` in the repository's root reaches this cluster. The
# client needs no token: the cluster token is for the raft ports only, and
# HTTP auth is off unless a node is given --auth-file.
#
# usage: scripts/run-cluster.sh [build-dir]        (make run does this)
# env:   TIERKV_RUN_RAFT_BASE (7000), TIERKV_RUN_HTTP_BASE (8000): node i uses
#        base+i; TIERKV_RUN_DATA (./data)
set -uo pipefail

# In the terminal's foreground group (pgrp = tpgid, fields 5 and 8 of
# /proc/PID/stat): run the rest as a foreground job of its own (see above).
if [ -z "${TIERKV_RUN_AS_JOB:-}" ] && [ -t 0 ] &&
    read -r _ _ _ _ pgrp _ _ tpgid _ </proc/$$/stat 2>/dev/null &&
    [ "$pgrp" = "$tpgid" ]; then
    set -m
    TIERKV_RUN_AS_JOB=1 bash "${BASH_SOURCE[0]}" "$@"
    exit $?
fi
unset TIERKV_RUN_AS_JOB

build=${1:-build}
bin="$build/cmd/tierkvd/tierkvd"
cli="$build/cmd/tierkv/tierkv"
raft_base=${TIERKV_RUN_RAFT_BASE:-7000}
http_base=${TIERKV_RUN_HTTP_BASE:-8000}
data=${TIERKV_RUN_DATA:-./data}

if [ ! -x "$bin" ]; then
    echo "run-cluster: $bin not found; build first (make build)" >&2
    exit 1
fi

members="" ; mhttp="" ; ports=""
for i in 1 2 3; do
    members+="${members:+,}$i=127.0.0.1:$((raft_base + i))"
    mhttp+="${mhttp:+,}$i=127.0.0.1:$((http_base + i))"
    ports+=" $((raft_base + i)) $((http_base + i))"
done
# One python3 for all six ports (its start-up is slow on some machines).
# shellcheck disable=SC2086
if ! python3 - $ports <<'PY'
import socket, sys
for p in sys.argv[1:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", int(p)))
    except OSError:
        print("run-cluster: port %s is in use; free it or set TIERKV_RUN_RAFT_BASE /"
              " TIERKV_RUN_HTTP_BASE" % p, file=sys.stderr)
        sys.exit(1)
    finally:
        s.close()
PY
then
    exit 1
fi

mkdir -p "$data"

# The cluster token: made once, then reused.
token="$data/peer-token"
if [ -L "$token" ] || { [ -e "$token" ] && [ ! -f "$token" ]; }; then
    echo "run-cluster: $token is not a regular file; remove it (a new token is made)" >&2
    exit 1
fi
if [ ! -s "$token" ]; then
    rm -f "$token" # an empty one (an interrupted first start)
    tmp=$(umask 077 && mktemp "$token.XXXXXX") || {
        echo "run-cluster: cannot write in $data" >&2
        exit 1
    }
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tmp")
    # ln, not mv: it does not replace a token another start linked meanwhile.
    ln "$tmp" "$token" 2>/dev/null
    rm -f "$tmp"
    if [ ! -s "$token" ]; then
        echo "run-cluster: cannot make the cluster token $token" >&2
        exit 1
    fi
    token_state="made now"
else
    token_state="reused"
fi
# tierkvd refuses a token file open to group or others: fix ours.
mode=$(stat -c %a "$token")
if [ "$mode" != 600 ]; then
    if [ ! -O "$token" ] || ! chmod 600 "$token"; then
        echo "run-cluster: $token is mode $mode and not ours to fix;" \
            "chmod 600 it or remove it (a new token is made)" >&2
        exit 1
    fi
    token_state="$token_state (it was mode $mode, now 0600)"
fi

# The client's endpoints file (see above), replaced whole.
eps="127.0.0.1:$((http_base + 1)),127.0.0.1:$((http_base + 2)),127.0.0.1:$((http_base + 3))"
if ! { printf '%s\n' "$eps" >"$data/endpoints.tmp" && mv -f "$data/endpoints.tmp" "$data/endpoints"; }; then
    echo "run-cluster: cannot write $data/endpoints" >&2
    exit 1
fi

pids=()
stopping=0
stop_all() {
    [ "$stopping" = 1 ] && return
    stopping=1
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
    # One line, on a line of its own after the terminal's ^C.
    echo
    echo "run-cluster: stopped the cluster (data kept in $data; logs in $data/n*.log)"
}
trap 'stop_all; exit 0' INT TERM
trap 'stop_all' EXIT

for i in 1 2 3; do
    # setsid: a session of its own, out of the terminal's foreground group.
    setsid "$bin" --id "$i" --members "$members" --members-http "$mhttp" \
        --listen-http "127.0.0.1:$((http_base + i))" \
        --data-dir "$data/n$i" --store fs --peer-token-file "$token" \
        >>"$data/n$i.log" 2>&1 &
    pids+=($!)
done

# Wait (at most 20 s) until the three nodes agree on a leader.
leader=$(python3 - "$http_base" <<'PY'
import json, sys, time, urllib.request
base = int(sys.argv[1])
deadline = time.time() + 20
while time.time() < deadline:
    try:
        sts = [json.load(urllib.request.urlopen(
            "http://127.0.0.1:%d/v1/cluster" % (base + i), timeout=1)) for i in (1, 2, 3)]
        leaders = {s["leader"] for s in sts}
        if len(leaders) == 1 and 0 not in leaders:
            print(leaders.pop())
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.05)
sys.exit(1)
PY
)
if [ -z "$leader" ]; then
    echo "run-cluster: no leader after 20 s; see $data/n*.log" >&2
    tail -n 5 "$data"/n*.log >&2
    exit 1
fi

h1="127.0.0.1:$((http_base + 1))"
cat <<EOF2
tierkv cluster is up: node $leader leads.

  node  http                     raft                     data
  1     http://127.0.0.1:$((http_base + 1))    127.0.0.1:$((raft_base + 1))          $data/n1
  2     http://127.0.0.1:$((http_base + 2))    127.0.0.1:$((raft_base + 2))          $data/n2
  3     http://127.0.0.1:$((http_base + 3))    127.0.0.1:$((raft_base + 3))          $data/n3

Raft peers authenticate with the cluster token in $token: mode 0600, $token_state.

Try (any node takes writes: a follower forwards them to the leader, node $leader):
  curl -X PUT --data-binary 'hello' http://$h1/v1/kv/greeting
  curl http://$h1/v1/kv/greeting
  curl 'http://$h1/v1/kv/greeting?raw'
  curl -X POST 'http://$h1/v1/kv/visits/incr?delta=1'
  curl 'http://$h1/v1/kv?prefix=gr&limit=10'
  curl http://$h1/v1/cluster
  curl http://$h1/metrics
  open http://$h1/ui            (the status page, in a browser)
EOF2
if [ -x "$cli" ]; then
    # ./data/endpoints is read from the working directory: name the
    # endpoints when the data directory is elsewhere.
    e=""
    [ "$(realpath -m "$data")" = "$(realpath -m ./data)" ] || e=" --endpoints $eps"
    cat <<EOF2
  $cli$e put greeting hello
  $cli$e get greeting
  $cli$e status
EOF2
    [ -n "$e" ] || echo "  (tierkv finds the nodes in $data/endpoints; elsewhere: export TIERKV_ENDPOINTS=$eps)"
fi
echo
echo "Logs: $data/n1.log $data/n2.log $data/n3.log. Ctrl-C stops the cluster."

# Stay until Ctrl-C, or until a node exits on its own.
while :; do
    for idx in 0 1 2; do
        if ! kill -0 "${pids[$idx]}" 2>/dev/null; then
            echo "run-cluster: node $((idx + 1)) exited; see $data/n$((idx + 1)).log" >&2
            stop_all
            exit 1
        fi
    done
    sleep 1 &
    wait $! 2>/dev/null
done
