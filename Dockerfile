# torchplace's server image, two targets (commands in docs/deploy.md):
#   docker build --target cpu  -t torchplace:cpu  .
#   docker build --target cuda -t torchplace:cuda .
# EXTRAS picks the extras installed with the package (serve; serve,ray for Ray clusters).
# The container runs `torchplace` as a non-root user; KServe's runtime passes `serve ...`.

ARG TORCH_VERSION=2.13.0

# --- CPU: torch's CPU wheel on a slim Python --------------------------------------------
FROM python:3.11-slim AS cpu
ARG TORCH_VERSION
ARG EXTRAS=serve
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
WORKDIR /opt/torchplace
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" \
    && pip install ".[${EXTRAS}]"
RUN useradd --uid 1000 --create-home torchplace
USER 1000
EXPOSE 8080
ENTRYPOINT ["torchplace"]
CMD ["serve", "--host=0.0.0.0", "--port=8080"]

# --- CUDA: the CUDA runtime image, torch's CUDA wheel from PyPI -------------------------
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS cuda
ARG TORCH_VERSION
ARG EXTRAS=serve
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
WORKDIR /opt/torchplace
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install "torch==${TORCH_VERSION}" && pip install ".[${EXTRAS}]"
RUN useradd --uid 1001 --create-home torchplace
USER 1001
EXPOSE 8080
ENTRYPOINT ["torchplace"]
CMD ["serve", "--host=0.0.0.0", "--port=8080"]
