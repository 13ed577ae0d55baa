# syntax=docker/dockerfile:1
# The controlplane daemon and CLI: the sidecar beside tritonserver (deploy/k8s/).
#
#   docker build -t ghcr.io/controlplane-project/controlplane:0.1.0 --build-arg VERSION=0.1.0 .
#   docker run ghcr.io/controlplane-project/controlplane:0.1.0                  # controlplane serve
#   docker run ghcr.io/controlplane-project/controlplane:0.1.0 deploy resnet r2 --wait --url ... --token ...
#
# Runtime dependencies only, at the versions constraints.txt pins: no `triton` extra (the bundled
# nvidia-pytriton server is for development and tests; in a pod, Triton is its own container).

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md LICENSE ./
COPY controlplane ./controlplane
# Triton's protocol, generated into the package from tritonclient's compiled protos (pyproject's
# `protos` extra, at the version constraints.txt pins): the daemon speaks Triton's gRPC API
# without tritonclient, so neither it nor numpy is in the image.
RUN pip install --no-cache-dir --constraint constraints.txt 'tritonclient[grpc]' \
    && python -m controlplane.adapters.triton.generate_protos
# One wheel for the project and one for each runtime dependency, so the runtime stage installs
# from /wheels alone, with no index and no build tools.
RUN pip wheel --no-cache-dir --wheel-dir /wheels --constraint constraints.txt .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="controlplane" \
      org.opencontainers.image.description="Safe, fast model updates for NVIDIA Triton Inference Server: a sidecar that verifies, places and loads releases with no failed inference" \
      org.opencontainers.image.source="https://github.com/controlplane-project/controlplane" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A fixed numeric uid/gid: Kubernetes' runAsNonRoot can only verify a numeric USER, and
# deploy/k8s runs tritonserver as the same uid so the residue audit may read its /proc entries.
RUN groupadd --system --gid 10001 controlplane \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin controlplane \
    && mkdir -p /models /var/lib/controlplane \
    && chown 10001:10001 /models /var/lib/controlplane
# The wheels are bind-mounted from the builder, so none of them stays in a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels /wheels/controlplane-*.whl
WORKDIR /var/lib/controlplane
USER 10001:10001
EXPOSE 8080
# Docker only; Kubernetes ignores HEALTHCHECK and uses the pod's probes (/healthz, /readyz).
# Slim images have no curl: Python's urllib it is (any non-2xx answer raises, exit 1).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["controlplane"]
CMD ["serve"]
