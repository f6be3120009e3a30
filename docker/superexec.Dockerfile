# SuperExec for fedclust: runs the ServerApp (pointed at the SuperLink), the ClientApp
# (pointed at a SuperNode) or the Fleet gateway (fedclust deploy fleet-gateway).
# The official image has flwr; we add fedclust and its dependencies.
# Build context: the repository root (see docker/compose.yml).
ARG FLWR_VERSION=1.42.0
FROM flwr/superexec:${FLWR_VERSION}
WORKDIR /app
# CPU-only torch first (the default wheel pulls CUDA), then fedclust with the `nn` extra
# (FedCRef, EMD-CFL), which accepts that torch.
# flwr itself comes from the base image: drop it from the dependency list before installing.
COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app fedclust ./fedclust
COPY --chown=app:app strategies ./strategies
COPY --chown=app:app client_apps ./client_apps
COPY --chown=app:app server_app ./server_app
RUN python -m pip install --no-cache-dir torch==2.13.0 \
        --index-url https://download.pytorch.org/whl/cpu \
    && sed -i 's/.*"flwr\[simulation\].*//' pyproject.toml \
    && python -m pip install --no-cache-dir ".[nn]"
ENV FLWR_TELEMETRY_ENABLED=0
ENTRYPOINT ["flower-superexec"]
