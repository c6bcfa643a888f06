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
# Base images are pinned by digest (image:tag@sha256:...; with both, the digest is what
# is pulled and the tag says what it is). These digests were not looked up in the
# registries from where this file was written (none was reachable there): they were
# taken from public builds that resolved these tags (a BuildKit build log's resolve line
# for rust:1.95-bookworm; public Dockerfiles pinning distroless/cc-debian12:nonroot), so
# they may be older than what the tags name today. Tags move on rebuilds (Debian security
# updates): refresh the digests, each the tag's multi-platform index, with
#   docker buildx imagetools inspect rust:1.95-bookworm --format '{{json .Manifest.Digest}}'
#   docker buildx imagetools inspect gcr.io/distroless/cc-debian12:nonroot --format '{{json .Manifest.Digest}}'
# or `crane digest <image:tag>`, write each after its tag below, and rebuild; or let a
# dependency bot (Renovate's dockerfile manager, Dependabot's docker ecosystem) open
# those updates.
#
# The image carries the SBOM of the operator binary, sbom/gpujob-operator.cdx.json
# (CycloneDX: the crates the binary is built from, from Cargo.lock; scripts/sbom.sh writes
# it and the test command checks it is current), at
# /usr/share/doc/gpujob-operator/sbom.cdx.json. It does not list the base image's Debian
# packages (glibc, libgcc, CA certificates): BuildKit's SBOM attestation (`docker buildx
# build --sbom=true`) or an image scanner lists those.
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p gpujob-operator --bin gpujob-operator \
 && cp target/release/gpujob-operator /gpujob-operator

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
# checkov:skip=CKV_DOCKER_2: Kubernetes probes the operator (GET /healthz, /readyz in deploy/operator/deployment.yaml); distroless has no shell or curl for a HEALTHCHECK, and Kubernetes ignores HEALTHCHECK
COPY --from=build /gpujob-operator /usr/local/bin/gpujob-operator
COPY sbom/gpujob-operator.cdx.json /usr/share/doc/gpujob-operator/sbom.cdx.json
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gpujob-operator"]
CMD ["run"]
