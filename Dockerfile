# One image for the operator (`spillway manager`) and its drainers
# (`spillway drain`): the operator's Deployment builder sets the subcommand,
# so both always run the same version.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t spillway .
#
# `make image` builds the same image without Docker (hack/image): the same
# base files, binary path, user, working directory, environment and
# entrypoint, which test/packaging checks against this file.

# The build stage runs on the builder's platform and cross-compiles, which is
# far faster than emulating the target.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
# Static, so it runs on an image with no libc.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o /out/spillway .
# The base's files, as make image lays them: the users (nonroot is 65532,
# the UID the operator's pod security contexts assume), the CA certificates
# (Mozilla's, pinned by go.mod) and /tmp.
RUN go run ./hack/image -rootfs /out/rootfs

# No shell, no package manager, no libc.
FROM scratch
COPY --from=build /out/rootfs/ /
COPY --from=build /out/spillway /usr/local/bin/spillway
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /home/nonroot
ENTRYPOINT ["/usr/local/bin/spillway"]
