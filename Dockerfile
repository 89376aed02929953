# kvroute's container image: the web UI built with npm, a static release binary (glibc,
# crt-static) with the UI embedded, and a runtime stage of that binary alone on `scratch`,
# run as a non-root user. Build: `docker build -t kvroute/kvroute:0.1.0 .` (or podman /
# buildah). The builder stages pull `node` and `rust` from Docker Hub; kvroute's CI cannot
# reach a container registry, so it lints this file (hadolint) and builds the runtime stage
# from its own binary (scripts/container.sh). See docs/deploy.md.

FROM node:20-bookworm-slim AS ui
WORKDIR /src/ui
COPY ui/package.json ui/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY ui/ ./
RUN npm run build

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates/ crates/
COPY deploy/ deploy/
COPY --from=ui /src/ui/dist ui/dist
# A static binary (libc, libstdc++ of the vendored libzmq and all): nothing to install in
# the runtime stage. The explicit target keeps build scripts and proc macros dynamic.
ENV RUSTFLAGS="-C target-feature=+crt-static"
RUN cargo build --release --locked --target x86_64-unknown-linux-gnu -p kvroute --bin kvroute \
    && mkdir -p /out/usr/local/bin /out/tmp \
    && cp target/x86_64-unknown-linux-gnu/release/kvroute /out/usr/local/bin/kvroute

FROM scratch AS runtime
COPY --from=build /out/ /
USER 65532:65532
EXPOSE 8000 9002 9003 9090
ENTRYPOINT ["/usr/local/bin/kvroute"]
CMD ["--help"]
