# syntax=docker/dockerfile:1
# Herald's images. `docker build -t herald .` builds the default image with all three
# binaries (the Helm chart's); `--target gateway|worker|loadtest` builds one-binary images.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build artifacts across builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
    && mkdir -p /out \
    && cp target/release/herald-gateway target/release/herald-worker target/release/herald-loadtest /out/

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin herald
USER 10001
# No RUST_LOG here: it wins over the `log` key, so it would override the level that the
# chart (HERALD_LOG) or an operator sets. The `log` key defaults to `info`.

FROM runtime AS gateway
COPY --from=build /out/herald-gateway /usr/local/bin/
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/herald-gateway"]

FROM runtime AS worker
COPY --from=build /out/herald-worker /usr/local/bin/
EXPOSE 9091
ENTRYPOINT ["/usr/local/bin/herald-worker"]

FROM runtime AS loadtest
COPY --from=build /out/herald-loadtest /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/herald-loadtest"]

FROM runtime AS all
COPY --from=build /out/ /usr/local/bin/
EXPOSE 8080 9090 9091 9099
