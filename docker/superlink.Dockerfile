# SuperLink for fedclust: the official image, pinned. The SuperLink never runs app code
# (process isolation: ServerApps run in the `superexec-serverapp` container), so nothing to add.
# Pin by digest in production: FROM flwr/superlink:1.42.0@sha256:...
ARG FLWR_VERSION=1.42.0
FROM flwr/superlink:${FLWR_VERSION}
ENTRYPOINT ["flower-superlink"]
