package image

import (
	"encoding/pem"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The image's user, as distroless's nonroot: the UID the operator's pod
// security contexts assume.
const (
	UID  = 65532
	User = "65532:65532"
	Home = "/home/nonroot"
	// CABundle is where Go, OpenSSL and most libraries look first.
	CABundle = "/etc/ssl/certs/ca-certificates.crt"
)

// Base is the root file system under the binary, the same for `make image`
// and the Dockerfile (which copies it from `go run ./hack/image -rootfs`):
// the users, the name-service order, the CA certificates and a /tmp. The CA
// bundle is Mozilla's, as golang.org/x/crypto/x509roots carries it at the
// version go.mod pins, so it changes with a commit and not with the build
// machine.
func Base() []File {
	return []File{
		{Path: "/etc", Mode: 0o755, Dir: true},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
				"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		// Go's resolver reads it for the order of /etc/hosts and DNS.
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Path: "/etc/ssl", Mode: 0o755, Dir: true},
		{Path: "/etc/ssl/certs", Mode: 0o755, Dir: true},
		{Path: CABundle, Mode: 0o644, Data: caBundle()},
		{Path: "/home", Mode: 0o755, Dir: true},
		{Path: Home, Mode: 0o700, UID: UID, GID: UID, Dir: true},
		{Path: "/root", Mode: 0o700, Dir: true},
		{Path: "/tmp", Mode: 0o1777, Dir: true},
	}
}

// caBundle is the roots as one PEM file. A root with constraints that
// X.509 cannot carry (NSS's distrust-after dates) is left out: a file of
// certificates would trust it without them.
func caBundle() []byte {
	var out []byte
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate})...)
	}
	return out
}
