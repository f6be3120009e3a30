#!/usr/bin/env bash
# The docker/compose.yml topology as plain processes on one machine (no Docker engine needed):
# 1 SuperLink + 1 SuperExec (ServerApps) + 1 Fleet gateway + N x (SuperNode + SuperExec
# (ClientApps)), all with --isolation process, each SuperNode pointed at its own data file; then
# one `flwr run`, the run's status check (not just the exit code), and teardown of every
# process, even on failure, Ctrl-C or SIGTERM.
# The SuperLink's port (Fleet + Control + Runtime API; the Control API has no login) is bound to
# 127.0.0.1 and used only by the operator's flwr CLI and the ServerApp SuperExec; the SuperNodes
# dial the Fleet gateway (`fedclust deploy fleet-gateway`), which forwards nothing but
# the Fleet API. On real machines the gateway listens on the network, the SuperLink stays local.
#
#   fedclust deploy processes [--tls] [--keep] DATA_0 DATA_1 ... [-- run-config overrides]
#   fedclust deploy processes --tls /data/c0.npz /data/c1.npz /data/c2.npz -- \
#       method=\"exact-fcm\" fcm.max-rounds=5
#
# (the same as scripts/deploy_local.sh ...). No data at hand? `--demo` writes 3 blob partitions
# first.
# --tls: TLS on the SuperLink (self-made CA, docker/make_certs.sh) + SuperNode authentication
#        (each node's own key from docker/make_node_key.sh; only its .pub is registered).
#
# Every wait has a deadline and fails loudly (exit 1, the relevant log tail) instead of going on:
#   FEDCLUST_PORT_TIMEOUT  (default 60 s)   SuperLink port open, held by *our* SuperLink
#   FEDCLUST_NODES_TIMEOUT (default 180 s)  all N SuperNodes online
#   FEDCLUST_RUN_TIMEOUT   (default 3600 s) the run reaches a finished:* status
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TLS=0 KEEP=0 DATA=() OVERRIDES=()
while (($#)); do
  case $1 in
    --tls) TLS=1 ;;
    --keep) KEEP=1 ;;
    --demo) DEMO=1 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    *) DATA+=("$(realpath "$1")") ;;
  esac
  shift
done
[[ -f .venv/bin/activate ]] && source .venv/bin/activate
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
WORK=$(mktemp -d -t fedclust-deploy-XXXX)
export FLWR_HOME=$WORK/flwr-home
mkdir -p "$FLWR_HOME"
PIDS=()
SLEEPER=
cleanup() {
  trap - EXIT INT TERM
  # a TERM that lands between `sleep &` and `SLEEPER=$!` leaves SLEEPER empty: kill every job
  [[ -n $SLEEPER ]] && kill "$SLEEPER" 2>/dev/null
  kill $(jobs -p) 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  sleep 2
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  echo "stopped ${#PIDS[@]} process groups; logs in $WORK"
}
# The EXIT trap tears down; INT/TERM only turn into an exit (bash runs a trap after the current
# foreground command, so every wait below is short or an interruptible `wait`).
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
start() {   # start LOGNAME CMD...: own process group, log to $WORK/LOGNAME.log
  local log=$WORK/$1.log; shift
  setsid "$@" >"$log" 2>&1 < /dev/null &
  PIDS+=($!)
}
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
die() {     # die MESSAGE [LOGNAME...]: print MESSAGE and the tails of the named logs, exit 1
  local msg=$1; shift
  echo "deploy_local.sh: ERROR: $msg" >&2
  for name in "$@"; do echo "--- $WORK/$name.log (tail)" >&2; tail -n 25 "$WORK/$name.log" >&2 || true; done
  exit 1
}
PORT_TIMEOUT=${FEDCLUST_PORT_TIMEOUT:-60}
NODES_TIMEOUT=${FEDCLUST_NODES_TIMEOUT:-180}
RUN_TIMEOUT=${FEDCLUST_RUN_TIMEOUT:-3600}

if [[ ${DEMO:-0} == 1 ]]; then
  python - "$WORK/data" <<'PY'
import sys
from pathlib import Path
from server_app.deploy import write_partitions
for p in write_partitions({"method": "exact-fcm", "num-clients": 3, "seed": 0}, Path(sys.argv[1])):
    print(p)
PY
  DATA=("$WORK"/data/c*.npz)
fi
N=${#DATA[@]}
((N >= 1)) || { echo "usage: $0 [--tls] DATA_0 [DATA_1 ...] [-- key=value ...]" >&2; exit 2; }

PORT=$(free_port)
LINK_TLS=(--insecure) NODE_TLS=(--insecure) EXEC_TLS=(--insecure) GATE_TLS=()
if ((TLS)); then
  bash docker/make_certs.sh "$WORK/certs" >/dev/null
  # as on real devices: every node makes its own key pair; only the .pub is registered
  for ((i = 0; i < N; i++)); do bash docker/make_node_key.sh "$WORK/nodes/client-$i" >/dev/null; done
  C=$WORK/certs
  LINK_TLS=(--ssl-ca-certfile "$C/ca.crt" --ssl-certfile "$C/server.pem"
            --ssl-keyfile "$C/server.key" --enable-supernode-auth)
  NODE_TLS=(--root-certificates "$C/ca.crt")
  EXEC_TLS=(--root-certificates "$C/ca.crt")
  GATE_TLS=(--certfile "$C/server.pem" --keyfile "$C/server.key" --ca-file "$C/ca.crt")
  printf '[superlink]\ndefault = "local-deploy"\n[superlink.local-deploy]\naddress = "127.0.0.1:%s"\nroot-certificates = "%s"\n' \
    "$PORT" "$C/ca.crt" > "$FLWR_HOME/config.toml"
else
  printf '[superlink]\ndefault = "local-deploy"\n[superlink.local-deploy]\naddress = "127.0.0.1:%s"\ninsecure = true\n' \
    "$PORT" > "$FLWR_HOME/config.toml"
fi

start superlink flower-superlink --host 127.0.0.1 --port "$PORT" --isolation process \
  --database "$WORK/state.db" --disable-runtime-dependency-installation "${LINK_TLS[@]}"
LINK_PID=${PIDS[-1]}
deadline=$((SECONDS + PORT_TIMEOUT))
until (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
  kill -0 "$LINK_PID" 2>/dev/null || die "flower-superlink exited before opening port $PORT" superlink
  ((SECONDS < deadline)) || die "SuperLink port $PORT not open after ${PORT_TIMEOUT}s" superlink
  sleep 0.5
done
# An open port is not proof that it is ours: if another program took the port first, our
# SuperLink fails to bind and exits ("address already in use") while the port stays open.
sleep 2
kill -0 "$LINK_PID" 2>/dev/null \
  || die "flower-superlink exited after port $PORT opened (port clash with another program?)" superlink
grep -qi "address already in use" "$WORK/superlink.log" \
  && die "port $PORT is held by another program; rerun to pick a new port" superlink
start superexec-serverapp flower-superexec --runtime-api-address "127.0.0.1:$PORT" "${EXEC_TLS[@]}"
FLEET_PORT=$(free_port)
start fleet-gateway python -m server_app.deploy fleet-gateway --listen "127.0.0.1:$FLEET_PORT" \
  --superlink "127.0.0.1:$PORT" "${GATE_TLS[@]+"${GATE_TLS[@]}"}"
GATE_PID=${PIDS[-1]}
deadline=$((SECONDS + PORT_TIMEOUT))
until (echo > "/dev/tcp/127.0.0.1/$FLEET_PORT") 2>/dev/null; do
  kill -0 "$GATE_PID" 2>/dev/null || die "the Fleet gateway exited before opening port $FLEET_PORT" fleet-gateway
  ((SECONDS < deadline)) || die "Fleet gateway port $FLEET_PORT not open after ${PORT_TIMEOUT}s" fleet-gateway
  sleep 0.5
done
for ((i = 0; i < N; i++)); do
  AUTH=()
  if ((TLS)); then
    flwr supernode register "$WORK/nodes/client-$i/client_credentials.pub" local-deploy >/dev/null
    AUTH=(--auth-supernode-private-key "$WORK/nodes/client-$i/client_credentials")
  fi
  NPORT=$(free_port)
  start "supernode-$i" flower-supernode --superlink "127.0.0.1:$FLEET_PORT" "${NODE_TLS[@]}" "${AUTH[@]}" \
    --isolation process --host 127.0.0.1 --port "$NPORT" --node-config "data-path=\"${DATA[$i]}\""
  # the ClientApp runs in this SuperExec's process: that is where the node's data must be readable
  start "superexec-clientapp-$i" flower-superexec --insecure --runtime-api-address "127.0.0.1:$NPORT"
done
echo "SuperLink 127.0.0.1:$PORT ($( ((TLS)) && echo 'TLS + SuperNode auth' || echo insecure)), Fleet gateway 127.0.0.1:$FLEET_PORT, $N SuperNodes; FLWR_HOME=$FLWR_HOME"
deadline=$((SECONDS + NODES_TIMEOUT)) online=0
while true; do
  online=$(flwr supernode ls local-deploy --format json 2>/dev/null | grep -c '"online"' || true)
  ((online >= N)) && break
  kill -0 "$LINK_PID" 2>/dev/null || die "flower-superlink exited while waiting for SuperNodes" superlink
  if ((SECONDS >= deadline)); then
    logs=(superlink); for ((i = 0; i < N; i++)); do logs+=("supernode-$i"); done
    die "only $online/$N SuperNodes online after ${NODES_TIMEOUT}s" "${logs[@]}"
  fi
  sleep 1
done
echo "$online/$N SuperNodes online"

OUT=${FEDCLUST_OUT:-$WORK/run}
RUNCFG=$WORK/run.toml
{ echo 'dataset = "local"'; echo "num-clients = $N"; echo "output-dir = \"$OUT\""
  for kv in "${OVERRIDES[@]}"; do echo "\"${kv%%=*}\" = ${kv#*=}"; done; } > "$RUNCFG"
T0=$(date +%s)
SUBMIT=$(flwr run "$ROOT" local-deploy --format json --run-config "$RUNCFG" 2>&1) \
  || die "flwr run failed to submit: $SUBMIT" superlink
RUN_ID=$(python -c 'import json,sys; t=sys.argv[1]; print(json.loads(t[t.index("{"):])["run-id"])' \
         "$SUBMIT" 2>/dev/null) || die "no run id in the output of flwr run: $SUBMIT" superlink
echo "submitted run $RUN_ID"
STATUS=unknown
deadline=$((SECONDS + RUN_TIMEOUT))
pause=1    # each `flwr ls` costs about 2 s of CPU: the pause between polls doubles up to 8 s
while true; do
  STATUS=$(flwr ls local-deploy --run-id "$RUN_ID" --format json 2>/dev/null | python -c \
    'import json,sys; t=sys.stdin.read(); print(json.loads(t[t.index("{"):])["runs"][0]["status"])' \
    2>/dev/null || echo unknown)
  [[ $STATUS == finished* ]] && break
  kill -0 "$LINK_PID" 2>/dev/null || die "flower-superlink exited during run $RUN_ID (last status: $STATUS)" superlink
  if ((SECONDS >= deadline)); then
    flwr log "$RUN_ID" local-deploy --show 2>/dev/null | tail -n 15 >&2 || true
    die "run $RUN_ID not finished after ${RUN_TIMEOUT}s (last status: $STATUS)" superlink superexec-serverapp
  fi
  sleep "$pause"
  pause=$((pause < 8 ? pause * 2 : 8))
done
flwr log "$RUN_ID" local-deploy --show | tail -n 15 || true
echo "run $RUN_ID: $STATUS in $(( $(date +%s) - T0 )) s; results: $OUT"
if ((KEEP)); then
  echo "kept running; Ctrl-C or SIGTERM to stop"
  while true; do sleep 3600 >/dev/null 2>&1 </dev/null & SLEEPER=$!; wait "$SLEEPER"; done
fi
[[ $STATUS == finished:completed ]]
