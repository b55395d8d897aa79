package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/drainer/webhook"
	"github.com/spillway-io/spillway/test/testenv"
)

// The webhook section: the webhook sink against a plain Go HTTP client
// posting the same payloads to the same receiver, one row per request and
// in batches, in interleaved rounds.

var webhookBatchRows = flag.Int("webhook-batch-rows", 50, "rows per request of the webhook section's batched runs")

// hookReceiver answers every POST with 204 at once and counts the rows it
// was sent: one per request, or a batch's Webhook-Batch-Size. It runs in
// this process, so its CPU counts in the drainer's group for the plain
// client and the drainer alike.
type hookReceiver struct {
	srv  *http.Server
	url  string
	rows atomic.Int64
}

func startHookReceiver() *hookReceiver {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	r := &hookReceiver{url: "http://" + l.Addr().String() + "/hook"}
	r.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// io.Discard reads through pooled buffers: a buffer of the
		// handler's own, 32 kB a request, was three quarters of what the
		// process allocated, and its collections marked the drainer's heap.
		_, _ = io.Copy(io.Discard, req.Body)
		n := int64(1)
		if batch := req.Header.Get("Webhook-Batch-Size"); batch != "" {
			n, _ = strconv.ParseInt(batch, 10, 64)
		}
		r.rows.Add(n)
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = r.srv.Serve(l) }()
	return r
}

// webhooks compares the webhook sink with a plain client, one row per
// request and in batches of -webhook-batch-rows.
func (b *bench) webhooks(ctx context.Context) []string {
	recv := startHookReceiver()
	defer func() { _ = recv.srv.Close() }()
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	dir, err := os.MkdirTemp("", "spillway-bench-webhook")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	secrets, err := testenv.WriteSecrets(dir, testenv.NewSecret())
	if err != nil {
		log.Fatal(err)
	}
	drain := func(batchRows int) run {
		b.seed(ctx, spec, *events, 0)
		return b.drain(ctx, spec, 1, func(c *drainer.Config) {
			wh := webhook.DefaultConfig()
			wh.URL, wh.AllowHTTP, wh.SigningSecretFile, wh.BatchRows = recv.url, true, secrets, batchRows
			c.Webhook = &wh
		})
	}
	var plain, plainBatched, one, batched scenario
	for round := range *rounds {
		log.Printf("webhook, round %d of %d: a plain client, the drainer, each one row per request and in batches of %d", round+1, *rounds, *webhookBatchRows)
		plain.add(b.postPlain(ctx, recv, 1))
		if round == 0 {
			profileStart()
		}
		one.add(drain(0))
		profileStop()
		plainBatched.add(b.postPlain(ctx, recv, *webhookBatchRows))
		batched.add(drain(*webhookBatchRows))
	}
	fmt.Printf("\nwebhook: %d events of %d bytes posted to a receiver in this process that answers 204 at once; depth %d (requests or rows in flight); "+
		"the drainer signs each request (Standard Webhooks); CPU of this process is the client's or the drainer's and the receiver's\n",
		*events, *payloadBytes, *depth)
	plain.report("plain Go HTTP client, a row per request (ceiling)", "")
	one.report("spillway webhook sink, a row per request", fmt.Sprintf("%.2f of ceiling", one.rate()/plain.rate()))
	plainBatched.report(fmt.Sprintf("plain Go HTTP client, %d rows per request", *webhookBatchRows), "")
	batched.report(fmt.Sprintf("spillway webhook sink, %d rows per request", *webhookBatchRows), fmt.Sprintf("%.2f of ceiling", batched.rate()/plainBatched.rate()))
	return []string{
		target("webhook ÷ plain client ≥ 0.7", fmt.Sprintf("%.2f", one.rate()/plain.rate()), one.rate() >= 0.7*plain.rate()),
		target("webhook, batched ÷ plain client ≥ 0.7", fmt.Sprintf("%.2f", batched.rate()/plainBatched.rate()), batched.rate() >= 0.7*plainBatched.rate()),
	}
}

// postPlain posts the events to the receiver as a plain Go HTTP client
// does: depth requests in flight over a keep-alive pool, rows per request
// (a JSON array of them when more than one), no signature, no database.
func (b *bench) postPlain(ctx context.Context, recv *hookReceiver, rows int) run {
	quiesce("plain client")
	log.Printf("posting with a plain client, %d rows per request", rows)
	defer log.Printf("posted")
	body := b.payload()
	if rows > 1 {
		envelopes := make([]string, rows)
		for i := range envelopes {
			envelopes[i] = fmt.Sprintf(`{"id":"%036d","routingKey":"bench.event","enqueuedAt":"%s","headers":null,"payload":%s,"payloadEncoding":"json"}`,
				i, time.Now().UTC().Format(time.RFC3339Nano), body)
		}
		body = []byte("[" + strings.Join(envelopes, ",") + "]")
	}
	requests := (*events + rows - 1) / rows
	workers := max(*depth/rows, 1)
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: workers, MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	recv.rows.Store(0)
	watch := startWatch(b.pool)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(requests) {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, recv.url, bytes.NewReader(body))
				if err != nil {
					log.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				if rows > 1 {
					req.Header.Set("Webhook-Batch-Size", strconv.Itoa(rows))
				}
				resp, err := client.Do(req)
				if err != nil {
					log.Fatalf("plain client: %v", err)
				}
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	r := watch.stop(requests * rows)
	r.wal = watch.walSince()
	return r
}
