# Lockgate in a container: one instance on the embedded SQLite default, its database (and the
# demo notes) on the /data volume, run as a user without privileges. For several instances,
# set DATABASE_URL to PostgreSQL and run `lockgate db upgrade` as a release step
# (docs/deploying.md).
#
#   docker build -t lockgate .
#   docker run --rm -v lockgate-data:/data lockgate keys create alice   # prints the key once
#   docker run -d -p 8000:8000 -v lockgate-data:/data --name lockgate lockgate
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1
ENV PYTHONUNBUFFERED=1
ENV PIP_NO_CACHE_DIR=1
ENV PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY spec ./spec
COPY machine ./machine
COPY server ./server
COPY simulation ./simulation
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin lockgate \
    && mkdir -p /data \
    && chown lockgate /data

USER lockgate
WORKDIR /data
VOLUME ["/data"]

ENV DATABASE_URL=sqlite:////data/lockgate.db
ENV LOCKGATE_NOTES_DIR=/data/notes
ENV LOCKGATE_HOST=0.0.0.0
ENV LOCKGATE_PORT=8000
ENV LOCKGATE_LOG_FORMAT=json
EXPOSE 8000

# Ready means boot recovery finished: /readyz answers 200 only then.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; url = 'http://127.0.0.1:' + os.environ.get('LOCKGATE_PORT', '8000') + '/readyz'; sys.exit(0 if urllib.request.urlopen(url, timeout=2).status == 200 else 1)"]

# SIGTERM drains within LOCKGATE_DRAIN_TIMEOUT (8 s), inside Docker's default 10 s grace.
STOPSIGNAL SIGTERM
ENTRYPOINT ["lockgate"]
CMD ["serve"]
