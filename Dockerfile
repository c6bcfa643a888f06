# gpujob-operator image: a static-enough release build on Debian, run as non-root from a
# distroless base. Build: docker build -t gpujob-operator:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p gpujob-operator --bin gpujob-operator \
 && cp target/release/gpujob-operator /gpujob-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /gpujob-operator /usr/local/bin/gpujob-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gpujob-operator"]
CMD ["run"]
