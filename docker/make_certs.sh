#!/usr/bin/env bash
# TLS material for the SuperLink (run on the operator's / SuperLink's machine).
#   docker/make_certs.sh [--force] [OUT_DIR=docker/certs] [DEMO_NODES=0] [EXTRA_SAN...]
# Writes to OUT_DIR: ca.crt (public: give it to every node and analyst), ca.key (the CA's secret:
# mounted nowhere, keep it offline), server.pem/server.key (the certificate of the SuperLink and
# of its Fleet gateway, SANs DNS:superlink, DNS:fleet-gateway, DNS:localhost, IP:127.0.0.1 +
# extras). Private keys are created with mode 600 (umask 077), never readable by others.
#
# An existing CA or SuperLink key is never replaced: every node trusts that ca.crt. Pass --force
# to make a new CA (then give the new ca.crt to every node and analyst).
#
# SuperNode keys are NOT made here: each device makes its own key pair and sends only the .pub
# (docker/make_node_key.sh DIR, i.e. ssh-keygen -t ecdsa -b 384). DEMO_NODES > 0 runs that script
# for DEMO_NODES nodes into OUT_DIR/../nodes/client-<i>/ — for a one-host demo or a test only,
# where "each device" is a folder on this machine.
# Same layout as `fedclust deploy certs DIR --nodes N` (no openssl needed there).
set -euo pipefail
umask 077                 # keys are created 600; the public certificates are opened up below
FORCE=() ARGS=()
for a in "$@"; do
  if [[ $a == --force ]]; then FORCE=(--force); else ARGS+=("$a"); fi
done
set -- "${ARGS[@]+"${ARGS[@]}"}"
OUT=${1:-$(dirname "$0")/certs}
N=${2:-0}
shift $(( $# > 2 ? 2 : $# )) || true
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$OUT"
for f in ca.key ca.crt server.key server.pem; do
  if [[ -e $f && ${#FORCE[@]} == 0 ]]; then
    echo "make_certs.sh: refusing to replace $OUT/$f: every SuperNode and analyst trusts this" \
         "CA. Keep it, or pass --force to make a new CA (then hand the new ca.crt to all of" \
         "them)." >&2
    exit 1
  fi
done
rm -f ca.key ca.crt server.key server.pem
SAN="DNS:superlink,DNS:fleet-gateway,DNS:localhost,IP:127.0.0.1"
for extra in "$@"; do
  if [[ $extra =~ ^[0-9.]+$ ]]; then SAN="$SAN,IP:$extra"; else SAN="$SAN,DNS:$extra"; fi
done
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -keyout ca.key -out ca.crt \
  -subj "/CN=fedclust CA" -addext "basicConstraints=critical,CA:TRUE" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
  -subj "/CN=superlink" 2>/dev/null
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$SAN" > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
  -extfile server.ext -out server.pem 2>/dev/null
rm -f server.csr server.ext ca.srl
chmod 644 ca.crt server.pem
echo "CA and SuperLink certificate in $OUT (ca.key: keep offline; it is mounted nowhere)"
for ((i = 0; i < N; i++)); do
  bash "$HERE/make_node_key.sh" "${FORCE[@]+"${FORCE[@]}"}" "$OUT/../nodes/client-$i" \
    "fedclust-node-$i" >/dev/null
done
((N > 0)) && echo "demo SuperNode keys (one host only): $(cd "$OUT/../nodes" && pwd)/client-<i>/client_credentials[.pub]"
# Flower's containers run as user `app` (uid/gid 49999), which cannot read the 600 key above.
echo "for Docker: sudo chown 49999:49999 $OUT/server.key   (undo: sudo chown \$USER $OUT/server.key)"
