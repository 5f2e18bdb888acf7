# The gateway image: the wheel built in one stage, installed into a slim runtime.
# No editable install and no source tree in the runtime: the Lua scripts and SQL
# migrations are package data inside the wheel.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY gateway ./gateway
COPY lua ./lua
COPY sql ./sql
# The gateway's wheel and every dependency's, at the lock's versions (the ones
# CI tested), so the runtime installs offline.
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c requirements.lock . \
    && cp requirements.lock /wheels/

FROM python:3.11-slim AS runtime
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin flashsale
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels \
        -c /wheels/requirements.lock flashsale-gateway \
    && rm -rf /wheels
ENV GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080 \
    PYTHONUNBUFFERED=1
USER flashsale
WORKDIR /tmp
EXPOSE 8080
# SIGTERM starts the lame duck, then the drain (GATEWAY_LAME_DUCK_S, GATEWAY_DRAIN_S),
# then the close (at most 8 s): give the container at least their sum before the
# kill (compose: stop_grace_period).
STOPSIGNAL SIGTERM
# /readyz: Redis and PostgreSQL answer and no stop has begun (urlopen raises on 503).
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=2 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('GATEWAY_PORT', '8080'), timeout=2)"]
CMD ["flashsale-gateway", "serve"]
