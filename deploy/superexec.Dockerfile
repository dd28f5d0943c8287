# The SuperExec image for both executors (ServerApp and ClientApp): Flower's image plus fedvit's dependencies.
# The app code itself arrives as the FAB with `flwr run`; installing the package here also provides `fedvit`.
# CPU torch by default; docker-compose.gpu.yml passes a CUDA wheel index instead.
ARG FLWR_VERSION=1.41.0
FROM flwr/superexec:${FLWR_VERSION}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /app
RUN python -m pip install --no-cache-dir --index-url ${TORCH_INDEX} torch torchvision

COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app core ./core
COPY --chown=app:app fedvit_app ./fedvit_app
COPY --chown=app:app clients ./clients
COPY --chown=app:app strategies ./strategies
COPY --chown=app:app attacks ./attacks
# flwr 1.41.0 is in the base image: install the app without the simulation extra (Ray is not needed here).
RUN sed -i 's/"flwr\[simulation\]==/"flwr==/' pyproject.toml \
    && python -m pip install --no-cache-dir . \
    && mkdir -p /app/outputs /app/data /app/state /app/keys
