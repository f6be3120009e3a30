#!/usr/bin/env bash
# A SuperNode's own key pair — run ON THE DEVICE that runs the SuperNode.
#   docker/make_node_key.sh [--force] [DIR=.] [COMMENT=fedclust-node]
# Writes DIR/client_credentials (private, mode 600 from the moment it exists: never leaves the
# device) and DIR/client_credentials.pub (send only this file to the operator, who runs
# `flwr supernode register client_credentials.pub <connection>`). This is exactly
#   ssh-keygen -t ecdsa -b 384 -N "" -f DIR/client_credentials
# (Flower's SuperNode authentication needs an EC key on a NIST curve in OpenSSH format.)
# An existing key is never replaced: the operator has registered its public half, and a new
# key would lock this node out. Pass --force to replace it (then register the new .pub).
set -euo pipefail
umask 077                 # private files are created 600; the .pub is opened up below
FORCE=0 ARGS=()
for a in "$@"; do
  if [[ $a == --force ]]; then FORCE=1; else ARGS+=("$a"); fi
done
DIR=${ARGS[0]:-.}
COMMENT=${ARGS[1]:-fedclust-node}
mkdir -p "$DIR"
KEY=$DIR/client_credentials
if [[ -e $KEY || -e $KEY.pub ]]; then
  if ((!FORCE)); then
    echo "make_node_key.sh: refusing to replace the existing key $KEY: its public half may be" \
         "registered with the SuperLink, and a new key would lock this node out." \
         "Keep it, or pass --force to replace it (then register the new $KEY.pub)." >&2
    exit 1
  fi
  rm -f "$KEY" "$KEY.pub"
fi
ssh-keygen -q -t ecdsa -b 384 -N "" -C "$COMMENT" -f "$KEY"
chmod 644 "$KEY.pub"
echo "private key $KEY (stays here); send $KEY.pub"
