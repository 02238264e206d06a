# Ballast gateway image: slim, non-root, one venv copied from a build stage.
#   docker build -t ballast .
#   docker run -p 8080:8080 -v $PWD/ballast.yaml:/etc/ballast/ballast.yaml:ro ballast
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /build
COPY pyproject.toml constraints.txt README.md ./
COPY src ./src
RUN python -m venv /opt/ballast \
 && /opt/ballast/bin/pip install --upgrade pip \
 && /opt/ballast/bin/pip install -c constraints.txt '.[tracing,bedrock,vertex]'

FROM python:3.11-slim
RUN groupadd --system --gid 10001 ballast \
 && useradd --system --uid 10001 --gid ballast --no-create-home --shell /usr/sbin/nologin ballast \
 && mkdir -p /var/lib/ballast /etc/ballast \
 && chown ballast:ballast /var/lib/ballast
COPY --from=build /opt/ballast /opt/ballast
ENV PATH=/opt/ballast/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The working directory holds what Ballast writes when no database is configured
# (the embedded SQLite file, the spend journal).
WORKDIR /var/lib/ballast
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health/live', timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["ballast"]
CMD ["serve", "--config", "/etc/ballast/ballast.yaml", "--host", "0.0.0.0", "--port", "8080", "--log-format", "json"]
