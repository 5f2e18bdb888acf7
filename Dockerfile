FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY lua ./lua
COPY sql ./sql
# Editable, so the package finds lua/ and sql/ beside it in /app.
RUN pip install --no-cache-dir -e .
ENV GATEWAY_HOST=0.0.0.0
EXPOSE 8080
USER nobody
CMD ["flashsale-gateway", "serve"]
