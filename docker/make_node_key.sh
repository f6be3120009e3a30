#!/usr/bin/env bash
# A SuperNode's own key pair — run ON THE DEVICE that runs the SuperNode.
#   docker/make_node_key.sh [DIR=.] [COMMENT=fedclust-node]
# Writes DIR/client_credentials (private, mode 600: never leaves the device) and
# DIR/client_credentials.pub (send only this file to the operator, who runs
# `flwr supernode register client_credentials.pub <connection>`). This is exactly
#   ssh-keygen -t ecdsa -b 384 -N "" -f DIR/client_credentials
# (Flower's SuperNode authentication needs an EC key on a NIST curve in OpenSSH format.)
set -euo pipefail
DIR=${1:-.}
mkdir -p "$DIR"
rm -f "$DIR/client_credentials" "$DIR/client_credentials.pub"
ssh-keygen -q -t ecdsa -b 384 -N "" -C "${2:-fedclust-node}" -f "$DIR/client_credentials"
chmod 600 "$DIR/client_credentials"
chmod 644 "$DIR/client_credentials.pub"
echo "private key $DIR/client_credentials (stays here); send $DIR/client_credentials.pub"
