# syntax=docker/dockerfile:1
# Herald's images. `docker build -t herald .` builds the default image with all three
# binaries (the Helm chart's); `--target gateway|worker|loadtest` builds one-binary images.
#
# Base images are pinned by tag and digest (multi-platform index digests), so a rebuild
# takes the same bases until someone moves them on purpose. To move one, read the new
# digest with `docker buildx imagetools inspect rust:<version>-bookworm` (or
# `debian:bookworm-<date>-slim`) and change the ARG below, or pass it at build time
# (`--build-arg RUNTIME_IMAGE=...`). Build and runtime stay on the same Debian release
# (bookworm), so the binaries find the glibc they were linked against.
# Labels and build info: `--build-arg VERSION=0.1.0 --build-arg GIT_COMMIT=$(git rev-parse HEAD)
# --build-arg CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)`.
ARG RUST_IMAGE=rust:1.95.0-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1
ARG RUNTIME_IMAGE=debian:bookworm-20260824-slim@sha256:88200866dfff7ea7f5cbcb6ec7c8a701889efe6fe859fe64d6990e4b07ea4171

FROM ${RUST_IMAGE} AS build
# herald_build_info{commit} (read by option_env! at compile time).
ARG GIT_COMMIT=unknown
ENV HERALD_GIT_COMMIT=${GIT_COMMIT}
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build artifacts across builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
    && mkdir -p /out \
    && cp target/release/herald-gateway target/release/herald-worker target/release/herald-loadtest /out/

FROM ${RUNTIME_IMAGE} AS runtime
ARG RUNTIME_IMAGE
ARG VERSION=0.1.0
ARG GIT_COMMIT=unknown
ARG CREATED=""
LABEL org.opencontainers.image.title="herald" \
      org.opencontainers.image.description="Herald: a Redis-backed WebSocket push gateway (gateway, worker, load-test)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
# The user and group the chart runs as (podSecurityContext runAsUser/runAsGroup 10001);
# numeric in USER, so `runAsNonRoot` can verify it without reading /etc/passwd.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 herald \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin herald
USER 10001:10001
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
