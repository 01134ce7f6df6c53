# syntax=docker/dockerfile:1
# One image for every cronstream service and command: `cronstream` is the entrypoint,
# the Kubernetes manifests (deploy/k8s) pass the command (`scheduler`, `worker`, `init`...).
#
#   docker build -t cronstream:0.1.0 .
#   docker run --rm cronstream:0.1.0 --version
#
# Handlers are added by building on top of it (docs/deploy.md, "Your handlers"):
#   FROM cronstream:0.1.0
#   USER root
#   RUN pip install --no-cache-dir my-handlers==1.2.0
#   USER 10001:10001
# and `cronstream worker --import my_handlers`.
#
# PYTHON_IMAGE: both stages must use the same image (the virtualenv is copied across
# and points at the interpreter by its path).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Dependencies first: this layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml README.md ./
COPY cronstream ./cronstream
COPY shared ./shared
COPY services ./services
COPY deploy/__init__.py ./deploy/__init__.py
COPY deploy/local ./deploy/local
# Wheels for cronstream and every dependency (confluent-kafka, asyncpg... ship manylinux
# wheels), installed into a virtualenv that the runtime stage copies as it is.
RUN python3 -m venv /opt/cronstream \
    && /opt/cronstream/bin/pip wheel --wheel-dir /wheels . \
    && /opt/cronstream/bin/pip install --no-index --find-links /wheels cronstream \
    && /opt/cronstream/bin/python -m compileall -q /opt/cronstream/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="cronstream" \
      org.opencontainers.image.description="A distributed job scheduler on Apache Kafka" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid/gid, so that `runAsUser: 10001` / `runAsNonRoot` in a pod spec can
# be checked by Kubernetes without reading /etc/passwd.
RUN groupadd --system --gid 10001 cronstream \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin cronstream
COPY --from=builder /opt/cronstream /opt/cronstream
# Read-only root filesystem: nothing is written outside /tmp (an emptyDir in the pod):
# no bytecode caches (compiled at build time above), the worker's forkserver socket and
# any handler's temporary files go to TMPDIR.
ENV PATH=/opt/cronstream/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    HOME=/tmp
WORKDIR /tmp
USER 10001:10001
# scheduler 9181, dispatcher 9182, worker 9183, monitor 9184, analytics 9185: /metrics,
# /healthz, /readyz; ui 8180: the web dashboard and the same three.
EXPOSE 9181 9182 9183 9184 9185 8180
ENTRYPOINT ["cronstream"]
CMD ["--help"]
