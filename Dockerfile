# Two images from one file (deploy/README.md); the last stage, `service`, is the default:
#   docker build --target service  -t shardplan .           the planner service, no torch
#   docker build --target training -t shardplan-training .  training jobs under torchrun
# Each builder stage installs into a venv at $VIRTUAL_ENV; its runtime stage copies that venv
# alone onto a fresh slim Python (no pip cache, no build tools, no sources). The builders'
# RUN lines are run as written, in a fresh venv, by tests/deploy/test_image.py: keep them plain
# shell commands.

ARG PYTHON_IMAGE=python:3.11-slim

# ----------------------------------------------------------------------------- builders
FROM ${PYTHON_IMAGE} AS source
ENV VIRTUAL_ENV=/opt/venv PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# What `pip install .` reads: the metadata and the three packages.
COPY pyproject.toml README.md ./
COPY planner_service ./planner_service
COPY clients ./clients
COPY runtime ./runtime

FROM source AS service-build
# The service extra: solver, FastAPI/uvicorn, PostgreSQL driver, metrics; no torch.
RUN python -m venv "$VIRTUAL_ENV"
RUN "$VIRTUAL_ENV/bin/pip" install '.[service]'

FROM source AS training-build
# The runtime extra: torch and FBGEMM (CPU build), the clients; no solver, no service stack.
# On CUDA hosts build with fbgemm-gpu==1.8.0 in place of fbgemm-gpu-cpu (pyproject.toml).
RUN python -m venv "$VIRTUAL_ENV"
RUN "$VIRTUAL_ENV/bin/pip" install '.[runtime]'

# ----------------------------------------------------------------------------- training
FROM ${PYTHON_IMAGE} AS training
RUN useradd --system --uid 10001 --home-dir /app shardplan && mkdir -p /app \
    && chown shardplan /app
COPY --from=training-build /opt/venv /opt/venv
COPY examples/dlrm /app/examples/dlrm
# SHARDPLAN_SERVER: the planner service the job fetches its plan from (train.py --server).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    OMP_NUM_THREADS=1
WORKDIR /app
USER 10001
# A job passes torchrun's arguments and the script's, e.g.
#   --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $MASTER:29400
#   examples/dlrm/train.py --plan alias:dlrm --server http://shardplan:8000
ENTRYPOINT ["torchrun"]
CMD ["--standalone", "--nproc-per-node", "1", "examples/dlrm/train.py", "--help"]

# ----------------------------------------------------------------------------- service
FROM ${PYTHON_IMAGE} AS service
RUN useradd --system --uid 10001 --home-dir /app shardplan \
    && mkdir -p /app/var && chown shardplan /app/var
COPY --from=service-build /opt/venv /opt/venv
# Configuration is the environment only (docs/service.md "Settings"; docs/operations.md).
# SQLite under the /app/var volume unless SHARDPLAN_DATABASE_URL names PostgreSQL.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SHARDPLAN_HOST=0.0.0.0 \
    SHARDPLAN_PORT=8000 \
    SHARDPLAN_HTTP_WORKERS=2 \
    SHARDPLAN_DATABASE_URL=/app/var/shardplan.db
WORKDIR /app
USER 10001
VOLUME /app/var
EXPOSE 8000
# Liveness: /healthz answers once uvicorn serves (readiness, the store too, is /readyz).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ['SHARDPLAN_PORT'], timeout=4)"]
# SIGTERM (docker stop) lets in-flight requests finish; give it longer than
# SHARDPLAN_MAX_TIME_LIMIT_S + SHARDPLAN_SOLVE_GRACE_S (docker stop -t, compose stop_grace_period).
ENTRYPOINT ["shardplan", "serve"]
