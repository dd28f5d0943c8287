# The SuperExec image for both executors (ServerApp and ClientApp): Flower's image plus fedvit's dependencies.
# `flwr run` ships the FAB (the run config); the code the apps import is the `fedvit` package installed here, so
# rebuild the image after changing fedvit's code.
#
# Base: Flower's SuperExec image with an explicit Python tag. Flower's plain `flwr/superexec:<version>` tag is
# built on the newest Python Flower supports (3.13 for 1.41), which fedvit's `requires-python` (<3.13) refuses;
# the `-py3.12-ubuntu24.04` variant of the same release is Flower's own image on Python 3.12.
# tests/test_deployment_files.py fails when this tag's Python does not satisfy pyproject's requires-python.
# Without Docker Hub: `fedvit deploy base-images` builds local stand-ins under the same tags (README).
ARG SUPEREXEC_BASE=flwr/superexec:1.41.0-py3.12-ubuntu24.04
FROM ${SUPEREXEC_BASE}

# CPU torch by default; docker-compose.gpu.yml passes a CUDA wheel index instead. When the index cannot be
# reached (air-gapped mirrors, proxies), PyPI's torch is installed instead and the build says so.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /app
RUN if python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)" \
        "${TORCH_INDEX%/}/torch/" >/dev/null 2>&1; then \
        echo "fedvit: torch from ${TORCH_INDEX}"; \
        python -m pip install --no-cache-dir --index-url "${TORCH_INDEX}" torch torchvision \
        && echo "${TORCH_INDEX}" > /app/.torch-source; \
    else \
        echo "fedvit: ${TORCH_INDEX} is unreachable: torch from PyPI instead (its default build, larger)"; \
        python -m pip install --no-cache-dir torch torchvision \
        && echo "https://pypi.org/simple (fallback: ${TORCH_INDEX} unreachable)" > /app/.torch-source; \
    fi

COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app LICENSE ./
COPY --chown=app:app src ./src
# flwr 1.41.0 is in the base image: install the app without the simulation extra (Ray is not needed here).
RUN sed -i 's/"flwr\[simulation\]==/"flwr==/' pyproject.toml \
    && python -m pip install --no-cache-dir . \
    && mkdir -p /app/outputs /app/data /app/state /app/keys
