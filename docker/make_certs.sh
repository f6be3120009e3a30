#!/usr/bin/env bash
# Make the TLS material and SuperNode keys for a fedclust deployment.
#   docker/make_certs.sh [OUT_DIR=docker/certs] [NUM_NODES=3] [EXTRA_SAN...]
# Writes: ca.crt/ca.key (self-signed CA), server.pem/server.key (SuperLink certificate with
# SANs DNS:superlink, DNS:localhost, IP:127.0.0.1 + extras), and client_credentials_<i>[.pub]
# (EC P-384 SuperNode keys in OpenSSH format, for --enable-supernode-auth).
# Same output as `python -m fedclust.deploy certs DIR --nodes N` (no openssl needed there).
set -euo pipefail
OUT=${1:-$(dirname "$0")/certs}
N=${2:-3}
shift $(( $# > 2 ? 2 : $# )) || true
mkdir -p "$OUT"
cd "$OUT"
SAN="DNS:superlink,DNS:localhost,IP:127.0.0.1"
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
for ((i = 0; i < N; i++)); do
  rm -f "client_credentials_$i" "client_credentials_$i.pub"
  ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedclust-node-$i" -f "client_credentials_$i"
done
# Public files readable by all; private keys by their owner only.
chmod 644 ca.crt server.pem ./*.pub
chmod 600 server.key ca.key client_credentials_* 2>/dev/null || true
chmod 644 ./*.pub
echo "certificates and $N SuperNode key pairs in $(pwd)"
# Flower's containers run as user `app` (uid/gid 49999), which cannot read the 600 private keys
# above: hand the folder to that uid before `docker compose up` (Flower's Docker TLS docs).
echo "for Docker: sudo chown -R 49999:49999 $(pwd)   (undo: sudo chown -R \$USER:\$(id -gn) $(pwd))"
