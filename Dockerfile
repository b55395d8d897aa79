# One image for the operator (`spillway manager`) and its drainers
# (`spillway drain`): the operator's Deployment builder sets the subcommand,
# so both always run the same version.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t spillway .

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

# Distroless static: no shell, no package manager. Its nonroot user, 65532,
# is the UID the operator's pod security contexts assume.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/spillway /usr/local/bin/spillway
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/spillway"]
