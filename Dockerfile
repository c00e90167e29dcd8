# outboxd container image.
#   docker build -t outboxd .
#   docker run --rm -v "$PWD/examples/docker/outboxd.toml:/etc/outboxd/outboxd.toml:ro" outboxd
# (docker-compose.yml builds and runs it next to PostgreSQL, MySQL and Kafka.)

# --- build -------------------------------------------------------------------------------
FROM rust:1-bookworm AS build
# librdkafka is compiled from source by the rdkafka crate (ssl, zstd, libz).
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake pkg-config libssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin outboxd \
 && install -D -m 0755 target/release/outboxd /out/outboxd

# --- runtime -----------------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libssl3 zlib1g ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin outboxd
COPY --from=build /out/outboxd /usr/local/bin/outboxd
USER outboxd
ENV OUTBOXD_CONFIG=/etc/outboxd/outboxd.toml
ENTRYPOINT ["outboxd"]
CMD ["run"]
