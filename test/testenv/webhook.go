package testenv

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Receiver is a webhook receiver on a real TCP port, as a partner's would be:
// it verifies every request's signature with the Standard Webhooks library,
// answers as its Answer says, and keeps a ledger of the rows it took (a 2xx
// answer, even one the sender stopped waiting for), by webhook-id.
type Receiver struct {
	// Answer decides each verified request's response: n is how many
	// requests for this id came before. Unset, every request gets 204.
	Answer func(w http.ResponseWriter, r *http.Request, id string, n int) (took bool)
	// Inspect, when set, sees each verified request's body.
	Inspect func(body []byte)

	mu        sync.Mutex
	requests  map[string]int
	took      map[string]int
	unsigned  int
	lastError string
	srv       *http.Server
	addr      string
	verifier  *standardwebhooks.Webhook
	// Secret is the secret the receiver verifies with, as a whsec_ string.
	Secret string
}

// NewSecret is a fresh Standard Webhooks signing secret.
func NewSecret() string {
	return "whsec_" + base64.StdEncoding.EncodeToString([]byte(UniqueName("secret-of-32-bytes-or-so")))
}

// StartReceiver listens on a free loopback port, verifying with secret.
func StartReceiver(secret string) (*Receiver, error) {
	v, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, err
	}
	r := &Receiver{requests: map[string]int{}, took: map[string]int{}, verifier: v, Secret: secret}
	return r, r.listen("127.0.0.1:0")
}

// listen serves on addr.
func (r *Receiver) listen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	r.addr = l.Addr().String()
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(l) }()
	return nil
}

// URL is the receiver's endpoint, with credentials that must never be shown.
func (r *Receiver) URL() string {
	return "http://spillway:receiver-password@" + r.addr + "/hooks/outbox?token=receiver-token"
}

// Addr is the receiver's host:port.
func (r *Receiver) Addr() string { return r.addr }

// Stop closes the receiver and every connection to it, as a crash would.
func (r *Receiver) Stop() { _ = r.srv.Close() }

// Restart serves again on the same port.
func (r *Receiver) Restart() error { return r.listen(r.addr) }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	id := req.Header.Get(standardwebhooks.HeaderWebhookID)
	if err == nil {
		err = r.verifier.Verify(body, req.Header)
	}
	if user, password, _ := req.BasicAuth(); err == nil && (req.URL.Query().Get("token") != "receiver-token" || req.Method != http.MethodPost ||
		user != "spillway" || password != "receiver-password") {
		err = fmt.Errorf("%s %s: not the endpoint's method, path, token or credentials", req.Method, req.URL.Path)
	}
	r.mu.Lock()
	n := r.requests[id]
	r.requests[id]++
	if err != nil {
		r.unsigned++
		r.lastError = err.Error()
	}
	answer, inspect := r.Answer, r.Inspect
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if inspect != nil {
		inspect(body)
	}
	took := true
	if answer != nil {
		req.Body = io.NopCloser(bytes.NewReader(body)) // read again, for an answer that reads it
		took = answer(w, req, id, n)
	} else {
		w.WriteHeader(http.StatusNoContent)
	}
	if took {
		r.mu.Lock()
		for _, id := range Carried(id, req.Header, body) {
			r.took[id]++
		}
		r.mu.Unlock()
	}
}

// Carried are the ids of the rows a request carries: its webhook-id, or
// for a batch request the ids of its envelopes.
func Carried(id string, h http.Header, body []byte) []string {
	if h.Get("Webhook-Batch-Size") == "" {
		return []string{id}
	}
	var envelopes []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &envelopes); err != nil {
		return nil
	}
	ids := make([]string, len(envelopes))
	for i, e := range envelopes {
		ids[i] = e.ID
	}
	return ids
}

// Account says, of the rows with these ids, how many the receiver never
// took and how many extra copies it took.
func (r *Receiver) Account(ids []string) (lost []string, duplicates int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return account(r.took, ids)
}

// Requests is how many requests arrived in all, and how many of them failed
// verification, with the last such failure.
func (r *Receiver) Requests() (total, unverified int, lastError string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.requests {
		total += n
	}
	return total, r.unsigned, r.lastError
}

// WriteSecrets writes signing secrets, one per line, to a file in dir.
func WriteSecrets(dir string, secrets ...string) (string, error) {
	file := filepath.Join(dir, "signing-secret")
	return file, os.WriteFile(file, []byte(strings.Join(secrets, "\n")+"\n"), 0o600)
}
