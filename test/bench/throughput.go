package main

import (
	"context"
	"fmt"
	"log"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/drainer/rabbitmq"
)

// The throughput section: the drainer against the broker's ceiling and
// the naive drainer.

// throughput compares the drainer with the broker's ceiling and with the
// naive drainer, in interleaved rounds, with each process's CPU and the WAL
// per event.
func (b *bench) throughput(ctx context.Context) []string {
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	naiveEvents := max(*events/5, 1000) // the naive drainer is slow: fewer events, the same rate
	drain := func(s *scenario, drainers int, tweak func(*drainer.Config)) {
		b.seed(ctx, spec, *events, 0)
		s.add(b.drain(ctx, spec, drainers, tweak))
	}
	tuned := func(c *drainer.Config) {
		c.BatchSize, c.PipelineDepth = *tunedBatch, *tunedDepth
		c.LeaseTTL = max(c.LeaseTTL, drainer.MinLeaseTTL(c.PipelineDepth))
	}
	// The broker, Postgres and the drainers share two cores here, and each
	// run leaves background work (queue index clean-up, WAL writing) behind:
	// rounds interleave the scenarios and their medians are compared.
	compactProperties := func(c *drainer.Config) { c.Broker.MessageProperties = rabbitmq.CompactProperties }
	var ceiling, properties, one, compact, keeping, two, best, naive, serial, synchronous scenario
	for round := range *rounds {
		log.Printf("round %d of %d: ceiling, ceiling with the drainer's properties, 1 drainer, 1 with compact properties, 1 keeping published rows, 2 drainers, tuned, naive",
			round+1, *rounds)
		ceiling.add(b.ceiling(ctx, false))
		properties.add(b.ceiling(ctx, true))
		if round == 0 {
			profileStart()
		}
		drain(&one, 1, nil)
		profileStop()
		drain(&compact, 1, compactProperties)
		drain(&keeping, 1, keepPublished)
		drain(&two, 2, nil)
		drain(&best, 1, tuned)
		b.seed(ctx, spec, naiveEvents, 0)
		naive.add(b.drainNaive(ctx, spec, naiveEvents))
	}
	drain(&serial, 1, func(c *drainer.Config) { c.SerialBatches = true })
	drain(&synchronous, 1, func(c *drainer.Config) { c.SynchronousCommit = true })

	c, o, t := ceiling.rate(), one.rate(), two.rate()
	d := drainer.DefaultConfig()
	fmt.Printf("\nthroughput: %d events of %d bytes; defaults batch %d, depth %d; tuned batch %d, depth %d; naive batch %d, one confirm at a time\n",
		*events, *payloadBytes, d.BatchSize, d.PipelineDepth, *tunedBatch, *tunedDepth, naiveBatch)
	ceiling.report(fmt.Sprintf("raw publisher, window %d (the ceiling)", *ceilingWindow), "")
	properties.report("raw publisher, the drainer's message properties", fmt.Sprintf("%.2f of ceiling", properties.rate()/c))
	one.report("spillway, 1 drainer, defaults", fmt.Sprintf("%.2f of ceiling", o/c))
	compact.report("spillway, 1 drainer, compact properties", fmt.Sprintf("%.2f of ceiling", compact.rate()/c))
	keeping.report("spillway, 1 drainer, published rows kept (168h)", fmt.Sprintf("%.2f of ceiling", keeping.rate()/c))
	two.report("spillway, 2 drainers, defaults", fmt.Sprintf("%.2f of 1 drainer", t/o))
	best.report("spillway, 1 drainer, tuned", fmt.Sprintf("defaults %.2f of it", o/best.rate()))
	naive.report("naive drainer", fmt.Sprintf("spillway %.1fx", o/naive.rate()))
	serial.report("spillway, 1 drainer, claims not overlapped", fmt.Sprintf("overlap gains %.2fx", o/serial.rate()))
	synchronous.report("spillway, 1 drainer, synchronous_commit on", fmt.Sprintf("async commit gains %.2fx", o/synchronous.rate()))

	raw, us, lean, kept := ceiling.perEvent(), one.perEvent(), compact.perEvent(), keeping.perEvent()
	// The same messages from the raw publisher tell the broker's cost of
	// Spillway's messages (their properties) from that of how it sends them.
	same := properties.perEvent()
	return []string{
		target("drainer ÷ ceiling ≥ 0.7", fmt.Sprintf("%.2f", o/c), o/c >= 0.7),
		target("drainer, compact properties ÷ ceiling ≥ 0.7", fmt.Sprintf("%.2f", compact.rate()/c), compact.rate()/c >= 0.7),
		target("2 drainers ≥ 1 drainer", fmt.Sprintf("%.2f", t/o), t >= o),
		target("defaults ≥ 0.95 × tuned", fmt.Sprintf("%.2f", o/best.rate()), o >= 0.95*best.rate()),
		target("spillway ÷ naive ≥ 5", fmt.Sprintf("%.1f", o/naive.rate()), o >= 5*naive.rate()),
		target("drainer CPU ≤ 1.5 × raw publisher's", fmt.Sprintf("%.2f", us[groupDrainer]/raw[groupDrainer]), us[groupDrainer] <= 1.5*raw[groupDrainer]),
		target("drainer CPU, compact ≤ 1.5 × raw publisher's", fmt.Sprintf("%.2f", lean[groupDrainer]/raw[groupDrainer]), lean[groupDrainer] <= 1.5*raw[groupDrainer]),
		target("RabbitMQ CPU ≤ raw publisher's", fmt.Sprintf("%.2f", us[groupBroker]/raw[groupBroker]), us[groupBroker] <= raw[groupBroker]),
		target("RabbitMQ CPU, compact ≤ raw publisher's", fmt.Sprintf("%.2f", lean[groupBroker]/raw[groupBroker]), lean[groupBroker] <= raw[groupBroker]),
		target("RabbitMQ CPU ≤ raw publisher's, same properties", fmt.Sprintf("%.2f", us[groupBroker]/same[groupBroker]), us[groupBroker] <= same[groupBroker]),
		target("Postgres CPU ≤ 15 µs/event", fmt.Sprintf("%.1f µs", us[groupDatabase]), us[groupDatabase] <= 15),
		target("Postgres CPU, published rows kept ≤ 15 µs/event", fmt.Sprintf("%.1f µs", kept[groupDatabase]), kept[groupDatabase] <= 15),
	}
}

// keepPublished keeps published rows a week (retention.published 168h):
// the settle marks what it would otherwise delete.
func keepPublished(c *drainer.Config) { week := 168 * time.Hour; c.Retention.Published = &week }

// scenario accumulates one scenario's runs.
type scenario struct {
	rates  []float64
	cpu    cpuUse
	wal    walUse
	events int
}

// run is one run's figures.
type run struct {
	rate     float64
	cpu      cpuUse
	wal      walUse
	events   int
	sessions sessionShares // of a drain
}

func (s *scenario) add(r run) {
	s.rates, s.cpu, s.wal, s.events = append(s.rates, r.rate), s.cpu.add(r.cpu), s.wal.add(r.wal), s.events+r.events
}

func (s *scenario) rate() float64 { return median(s.rates) }

// perEvent is each process group's CPU µs per event.
func (s *scenario) perEvent() []float64 {
	out := make([]float64, len(cpuGroups))
	for i := range out {
		out[i] = 1e6 * s.cpu.seconds[i] / float64(s.events)
	}
	return out
}

// report prints a scenario's median rate, the CPU per event of each process,
// the WAL per 1,000 events and, with several rounds, every round's rate.
func (s *scenario) report(what, ratio string) {
	rounds := ""
	if len(s.rates) > 1 {
		var each []string
		for _, v := range s.rates {
			each = append(each, fmt.Sprintf("%.0f", v))
		}
		rounds = "  rounds " + strings.Join(each, ", ")
	}
	var cpu []string
	perEvent := s.perEvent()
	for i, g := range cpuGroups {
		if g.shows(perEvent[i]) {
			cpu = append(cpu, fmt.Sprintf("%s %3.0f", g.name, perEvent[i]))
		}
	}
	fmt.Printf("%-50s %6.0f events/s  %-18s µs/event: %s  %s%s\n", what, s.rate(), ratio, strings.Join(cpu, ", "), s.wal.per1000(s.events), rounds)
}

// ceiling publishes as a plain publisher does, minus the database: a
// window of deferred confirms, waiting for the oldest when it is full. With
// properties, each message carries what a drainer's does (a uuid
// message_id, type, app_id, the row's timestamp), which tells whether the
// broker's cost per message is in them.
func (b *bench) ceiling(ctx context.Context, properties bool) run {
	quiesce("ceiling")
	log.Printf("publishing the ceiling (drainer's properties: %t)", properties)
	defer log.Printf("published")
	watch := startWatch(b.pool)
	b.publishRaw(ctx, properties, *events, nil, new(atomic.Int64))
	r := watch.stop(*events)
	r.wal = watch.walSince()
	b.purge()
	return r
}

// publishRaw publishes n messages as the ceiling does, or fewer if stop
// closes first, and counts those the broker confirmed.
func (b *bench) publishRaw(ctx context.Context, properties bool, n int, stop <-chan struct{}, confirmed *atomic.Int64) {
	ch, err := b.conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	body := b.payload()
	enqueued := time.Now()
	window := make([]*amqp.DeferredConfirmation, 0, *ceilingWindow)
	confirm := func(dc *amqp.DeferredConfirmation) {
		if !dc.Wait() {
			log.Fatal("raw publisher: broker nacked")
		}
		confirmed.Add(1)
	}
publishing:
	for i := range n {
		select {
		case <-stop:
			break publishing
		default:
		}
		if len(window) == *ceilingWindow {
			confirm(window[0])
			window = window[1:]
		}
		msg := amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: fmt.Sprint(i), ContentType: "application/json", Timestamp: time.Now(), Body: body}
		if properties {
			msg.MessageId = fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
			msg.Type, msg.AppId, msg.Timestamp = "bench.event", "spillway", enqueued
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, b.topo.Exchange, "bench.event", false, false, msg)
		if err != nil {
			log.Fatal(err)
		}
		window = append(window, dc)
	}
	for _, dc := range window {
		confirm(dc)
	}
}
