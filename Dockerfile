# syntax=docker/dockerfile:1
# gpujob-operator image: a release build on Debian bookworm, run as non-root on
# distroless/cc. The binary is dynamically linked against glibc (libc, libm, libgcc_s;
# TLS is rustls with ring, no OpenSSL), which distroless/cc-debian12 provides with the
# CA certificates; build and run images are the same Debian release, so the glibc
# versions match.
#
# Build (BuildKit, the default builder of current Docker):
#   docker build -t registry.example.com/gpujob-operator:0.1.0 .
#
# Dependencies are cached across builds: the cargo registry and target/ live in BuildKit
# cache mounts, so after a source change only the operator's own crates are compiled.
#
# Base images: pin them by digest where you build (FROM image:tag@sha256:...). This
# file names tags only because the digests could not be looked up where it was written
# (no registry access); resolve them with `docker buildx imagetools inspect <image>`
# and add them here, then let a dependency bot move them.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p gpujob-operator --bin gpujob-operator \
 && cp target/release/gpujob-operator /gpujob-operator

FROM gcr.io/distroless/cc-debian12:nonroot
# checkov:skip=CKV_DOCKER_2: Kubernetes probes the operator (GET /healthz, /readyz in deploy/operator/deployment.yaml); distroless has no shell or curl for a HEALTHCHECK, and Kubernetes ignores HEALTHCHECK
COPY --from=build /gpujob-operator /usr/local/bin/gpujob-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gpujob-operator"]
CMD ["run"]
