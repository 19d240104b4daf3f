# The planner service image: `shardplan[service]` (solver, FastAPI, PostgreSQL driver), no
# torch. Training images install `shardplan[runtime]` instead (torch and FBGEMM, no service
# stack); tools that only fetch plans need the core alone.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY planner_service ./planner_service
COPY clients ./clients
COPY runtime ./runtime
RUN pip install --no-cache-dir '.[service]' && useradd --system shardplan \
    && mkdir /app/var && chown shardplan /app/var
USER shardplan
# The SQLite store; mount a volume here, or set SHARDPLAN_DATABASE_URL=postgresql://...
VOLUME /app/var
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz')"
CMD ["shardplan", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
