# SuperNode for fedclust: the official image, pinned. With `--isolation process` the ClientApp
# runs in the node's `superexec-clientapp-*` container, which is where the node's data is mounted.
ARG FLWR_VERSION=1.42.0
FROM flwr/supernode:${FLWR_VERSION}
ENTRYPOINT ["flower-supernode"]
