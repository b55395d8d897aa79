package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// SampleFleet is config/samples, the two Secrets and the OutboxDrainer
// orders, made to run against the local services: the Secrets hold the test
// Postgres's and RabbitMQ's URLs, and the OutboxDrainer drains table into
// exchange and reads the outbox's status every statusInterval. Everything
// else is the sample as a user finds it, but for what edits change in the
// OutboxDrainer's spec.
func SampleFleet(table, exchange, statusInterval string, edits ...func(spec map[string]any)) (string, error) {
	return sample([]string{"config/samples/secrets.yaml", "config/samples/spillway_v1alpha1_outboxdrainer.yaml"}, map[string][][]string{
		"Secret/orders-db":       {{DatabaseURL(), "stringData", "url"}},
		"Secret/orders-rabbitmq": {{BrokerURL(), "stringData", "url"}},
		"OutboxDrainer/orders": {
			{table, "spec", "database", "table"},
			{exchange, "spec", "broker", "exchange"},
			{statusInterval, "spec", "statusInterval"},
		},
	}, edits)
}

// SampleWebhookFleet is config/samples/webhook, with the sample's Secret of
// the database, made to post to the receiver over http: its Secret holds
// the receiver's URL and signing secret, and the OutboxDrainer drains table,
// reading its status every statusInterval.
func SampleWebhookFleet(r *Receiver, c *Collector, table, statusInterval string, edits ...func(spec map[string]any)) (string, error) {
	return sample([]string{"config/samples/secrets.yaml", "config/samples/webhook/outboxdrainer-webhook.yaml"}, map[string][][]string{
		"Secret/orders-db":       {{DatabaseURL(), "stringData", "url"}},
		"Secret/orders-rabbitmq": nil,
		"Secret/partner-webhook": {{r.URL(), "stringData", "url"}, {r.Secret, "stringData", "signing-secret"}},
		"OutboxDrainer/orders-webhook": {
			{table, "spec", "database", "table"},
			{statusInterval, "spec", "statusInterval"},
			{c.Endpoint(), "spec", "telemetry", "endpoint"},
		},
	}, append([]func(map[string]any){func(spec map[string]any) {
		spec["sink"].(map[string]any)["webhook"].(map[string]any)["allowHTTP"] = true
	}}, edits...))
}

// sample reads the objects of files, each set as sets has it by kind/name
// (an object sets names with nil is left out), and the OutboxDrainers'
// specs changed by edits.
func sample(files []string, sets map[string][][]string, edits []func(spec map[string]any)) (string, error) {
	var docs []string
	for _, file := range files {
		data, err := os.ReadFile(filepath.Join(RepoRoot(), file))
		if err != nil {
			return "", err
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
				return "", fmt.Errorf("%s: %w", file, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			set, known := sets[obj.GetKind()+"/"+obj.GetName()]
			switch {
			case !known:
				return "", fmt.Errorf("%s has %s %s, which the test does not know", file, obj.GetKind(), obj.GetName())
			case set == nil:
				continue
			}
			for _, s := range set {
				if err := unstructured.SetNestedField(obj.Object, s[0], s[1:]...); err != nil {
					return "", err
				}
			}
			if spec, ok := obj.Object["spec"].(map[string]any); ok && obj.GetKind() == "OutboxDrainer" {
				for _, edit := range edits {
					edit(spec)
				}
			}
			out, err := yaml.Marshal(obj.Object)
			if err != nil {
				return "", err
			}
			docs = append(docs, string(out))
		}
	}
	return strings.Join(docs, "---\n"), nil
}

// ParseTable reads a table as kubectl get prints it into one map per row,
// by the header's column positions: an empty cell has no text to split on.
func ParseTable(out string) []map[string]string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 {
		return nil
	}
	header := lines[0]
	starts := regexp.MustCompile(`\S+`).FindAllStringIndex(header, -1)
	var rows []map[string]string
	for _, line := range lines[1:] {
		row := map[string]string{}
		for i, s := range starts {
			end := len(line)
			if i+1 < len(starts) && starts[i+1][0] < end {
				end = starts[i+1][0]
			}
			cell := ""
			if s[0] < end {
				cell = strings.TrimSpace(line[s[0]:end])
			}
			row[header[s[0]:s[1]]] = cell
		}
		rows = append(rows, row)
	}
	return rows
}
