package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/test/testenv"
)

// readyzOf asks a drainer pod's /readyz, as its kubelet does: the status
// code and the body, or 0 and why the pod could not be asked.
func readyzOf(ctx context.Context, pod string) (int, string) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return cluster.Node.Dial(ctx, shop, pod, net.JoinHostPort("127.0.0.1", strconv.Itoa(resource.MetricsPort)))
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+pod+"/readyz", nil)
	Expect(err).NotTo(HaveOccurred())
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// readyCondition is the fleet's Ready condition, or an empty one.
func readyCondition(ctx context.Context) metav1.Condition {
	c := meta.FindStatusCondition(outboxDrainer(ctx).Status.Conditions, string(v1alpha1.ConditionReady))
	if c == nil {
		return metav1.Condition{}
	}
	return *c
}

// renameAway renames the fleet's outbox table away while the fleet drains a
// burst, with the application writing on under the table's new name, and
// renames it back once the fleet says why it cannot drain: each drainer's
// /readyz, its pod's readiness, and the OutboxDrainer's Ready condition.
// It returns the fault, with every event accounted for.
func renameAway(ctx context.Context, outbox testenv.Outbox, ledger *testenv.Ledger) *fault {
	f := &fault{name: "outbox table renamed away, then back", timeline: testenv.NewTimeline()}
	drainers := readyPods(ctx, shop, drainerLabels)
	Expect(drainers).To(HaveLen(2))
	burst, err := outbox.Insert(ctx, faultBurst)
	Expect(err).NotTo(HaveOccurred())
	f.timeline.Mark("%d events written at once", len(burst))
	before := ledger.Total()
	Eventually(func() (int, error) { return ledger.Total() - before, ledger.Err() }, time.Minute, 20*time.Millisecond).Should(BeNumerically(">=", faultBurst/10))

	_, name, _ := strings.Cut(outbox.Table, ".")
	away := testenv.Outbox{DB: services.DB, Table: outbox.Table + "_away"}
	rename := func(from, to string) {
		_, err := services.DB.Exec(ctx, "ALTER TABLE "+from+" RENAME TO "+to)
		Expect(err).NotTo(HaveOccurred())
	}
	rename(outbox.Table, name+"_away")
	f.inject("ALTER TABLE %s RENAME TO %s_away", outbox.Table, name)
	DeferCleanup(func(ctx SpecContext) { // for the specs after a failure
		_, err := services.DB.Exec(ctx, "ALTER TABLE IF EXISTS "+away.Table+" RENAME TO "+name)
		Expect(err).NotTo(HaveOccurred())
	})
	during, err := away.Insert(ctx, 1000)
	Expect(err).NotTo(HaveOccurred())
	f.timeline.Mark("the application wrote %d more events under the new name", len(during))

	// Claims, and the settles of the rows in flight.
	cause := regexp.QuoteMeta(fmt.Sprintf(` on %s fail: ERROR: relation "%s" does not exist (SQLSTATE 42P01)`, outbox.Table, outbox.Table))
	cause = `(claims|settles)` + cause
	for _, d := range drainers {
		var body string
		Eventually(func() int {
			var code int
			code, body = readyzOf(ctx, d)
			return code
		}, 10*time.Second, 50*time.Millisecond).Should(Equal(http.StatusServiceUnavailable))
		Expect(body).To(MatchRegexp(cause))
		f.note("%s's /readyz answered 503 %.1fs after the rename: %s", d, (f.timeline.Since() - f.injected).Seconds(), body)
	}
	Eventually(func() []string { return readyPods(ctx, shop, drainerLabels) }, time.Minute, 100*time.Millisecond).Should(BeEmpty())
	f.note("both drainer pods unready %.1fs after the rename (their readiness probe fails twice, 2 s apart)", (f.timeline.Since() - f.injected).Seconds())
	Eventually(readyCondition).WithArguments(ctx).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(And(
		HaveField("Status", metav1.ConditionFalse), HaveField("Reason", v1alpha1.ReasonTableNotUsable),
		HaveField("Message", ContainSubstring(`relation "%s" does not exist (SQLSTATE 42P01)`, outbox.Table))))
	c := readyCondition(ctx)
	f.note("the OutboxDrainer Ready False %.1fs after the rename, %s: %s", (f.timeline.Since() - f.injected).Seconds(), c.Reason, c.Message)
	Expect(c.Message).NotTo(ContainSubstring("postgres://"))
	_, rows := getOutboxDrainers(shop)
	Expect(rows).To(ConsistOf(HaveKeyWithValue("READY", "False")))

	rename(away.Table, name)
	back := f.timeline.Mark("ALTER TABLE %s RENAME TO %s", away.Table, name)
	for _, d := range drainers {
		Eventually(func() int { code, _ := readyzOf(ctx, d); return code }, 10*time.Second, 20*time.Millisecond).Should(Equal(http.StatusOK))
		f.note("%s's /readyz answered 200 %.2fs after the table's return (the poll interval is 1 s)", d, (f.timeline.Since() - back).Seconds())
	}
	Eventually(func() []string { return readyPods(ctx, shop, drainerLabels) }, time.Minute, 100*time.Millisecond).Should(HaveLen(2))
	f.note("both drainer pods Ready %.1fs after the table's return", (f.timeline.Since() - back).Seconds())
	Eventually(readyCondition).WithArguments(ctx).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(HaveField("Status", metav1.ConditionTrue))
	f.note("the OutboxDrainer Ready True %.1fs after the table's return", (f.timeline.Since() - back).Seconds())

	f.account(ctx, outbox, ledger, append(burst, during...))
	return f
}
