package status

import (
	"errors"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/tier"
)

func TestStatus(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Status Suite")
}

// deployment is a Deployment of desired drainers, rolled out and all ready.
func deployment(desired int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Generation: 4},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: 4, Replicas: desired, UpdatedReplicas: desired, ReadyReplicas: desired, AvailableReplicas: desired,
		},
	}
}

func fleet(desired int32) Fleet {
	return Fleet{Generation: 7, DesiredReplicas: desired, Deployment: deployment(desired)}
}

var reachable = metav1.Condition{Type: "DatabaseReachable", Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonOutboxRead}

func timedOut(d *appsv1.Deployment) *appsv1.Deployment {
	d.Status.Conditions = []appsv1.DeploymentCondition{{
		Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded",
		Message: `ReplicaSet "orders-5d9" has timed out progressing.`,
	}}
	return d
}

var _ = Describe("Conditions", func() {
	Describe("DatabaseReachable", func() {
		It("is True when the outbox was read, and False with the probe's reason and message otherwise", func() {
			c := DatabaseReachable(Probe{Reason: v1alpha1.ReasonOutboxRead, Message: "Read the outbox table public.outbox"}, 7)
			Expect(c).To(Equal(metav1.Condition{Type: "DatabaseReachable", Status: metav1.ConditionTrue, ObservedGeneration: 7,
				Reason: "OutboxRead", Message: "Read the outbox table public.outbox"}))
			c = DatabaseReachable(Probe{Reason: v1alpha1.ReasonConnectionFailed, Message: "Connect to postgres://app:xxxxx@db/app: refused"}, 7)
			Expect(c.Status).To(Equal(metav1.ConditionFalse))
			Expect(c.Reason).To(Equal("ConnectionFailed"))
		})
	})

	Describe("Ready", func() {
		It("is True when every desired drainer is ready and the outbox was read", func() {
			c := Ready(fleet(3), nil, reachable)
			Expect(c).To(Equal(metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, ObservedGeneration: 7,
				Reason: "AllReplicasReady", Message: "3 of 3 drainers are ready"}))
		})

		It("counts the ready drainers while some are not", func() {
			f := fleet(3)
			f.Deployment.Status.ReadyReplicas = 1
			Expect(Ready(f, nil, reachable)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "ReplicasNotReady"),
				HaveField("Message", "1 of 3 drainers are ready")))
		})

		It("names the broker's block when drainers say it blocks their publishes, and Reconciling waits for it to clear", func() {
			f := fleet(3)
			f.Deployment.Status.ReadyReplicas, f.BrokerBlocked = 1, 2
			ready := Ready(f, nil, reachable)
			Expect(ready).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "BrokerBlocked"),
				HaveField("Message", "1 of 3 drainers are ready; 2 say the broker blocks publishing (a memory or disk alarm in its cluster), and claim nothing until it clears")))
			stalled := Stalled(7, ready, reachable, metav1.Condition{})
			Expect(stalled.Status).To(Equal(metav1.ConditionFalse), "an alarm clears on its own")
			Expect(Reconciling(7, ready, metav1.Condition{}, stalled)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "BrokerBlocked")))
		})

		It("says a Secret is missing before it says the database is unreachable", func() {
			unreachable := metav1.Condition{Type: "DatabaseReachable", Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonSecretNotFound, Message: `Secret "db" (database URL) was not found`}
			c := Ready(fleet(3), []string{`Secret "db" (database URL) was not found`, `Secret "mq" (broker URL) has no key "url"`}, unreachable)
			Expect(c.Reason).To(Equal("SecretNotFound"))
			Expect(c.Message).To(Equal(`Secret "db" (database URL) was not found; Secret "mq" (broker URL) has no key "url"`))
		})

		It("carries the database's message when the outbox cannot be read", func() {
			unreachable := metav1.Condition{Type: "DatabaseReachable", Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonConnectionFailed, Message: "Connect to postgres://app@db/shop: connection refused"}
			Expect(Ready(fleet(3), nil, unreachable)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "DatabaseUnreachable"),
				HaveField("Message", "Connect to postgres://app@db/shop: connection refused")))
		})

		DescribeTable("says the drainers cannot drain the table, in the database's words, when it answers but refuses them",
			func(reason, message string) {
				refused := metav1.Condition{Type: "DatabaseReachable", Status: metav1.ConditionFalse, Reason: reason, Message: message}
				Expect(Ready(fleet(3), nil, refused)).To(And(
					HaveField("Status", metav1.ConditionFalse), HaveField("Reason", reason), HaveField("Message", message)))
				Expect(Stalled(7, Ready(fleet(3), nil, refused), refused, metav1.Condition{}).Status).To(Equal(metav1.ConditionTrue), "until someone helps")
			},
			Entry("the table is gone", v1alpha1.ReasonTableNotUsable,
				`table public.outbox: ERROR: relation "public.outbox" does not exist (SQLSTATE 42P01); run spillway migrate to create it`),
			Entry("a privilege is revoked", v1alpha1.ReasonStatementRefused,
				"the database refuses the drainers' claims on public.outbox: ERROR: permission denied for table outbox (SQLSTATE 42501)"),
		)

		It("says the outbox has not been read yet before the first read", func() {
			Expect(Ready(fleet(3), nil, metav1.Condition{})).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "OutboxNotReadYet")))
		})

		It("says first that another object holds a child's name, naming it", func() {
			f := fleet(3)
			f.Paused = true
			f.Conflict = &Conflict{Kind: "ServiceAccount", Namespace: "shop", Name: "orders"}
			c := Ready(f, nil, reachable)
			Expect(c.Reason).To(Equal("ResourceConflict"))
			Expect(c.Message).To(HavePrefix("ServiceAccount shop/orders already exists and is not controlled by this OutboxDrainer (no controller)"))
			Expect(Degraded(f, 0).Reason).To(Equal("ResourceConflict"))
		})

		It("is False for a paused or empty fleet, whatever else is true", func() {
			f := fleet(0)
			f.Paused = true
			Expect(Ready(f, []string{"missing"}, reachable).Reason).To(Equal("Paused"))
			Expect(Ready(fleet(0), nil, reachable).Reason).To(Equal("ScaledToZero"))
		})
	})

	Describe("Stalled and Reconciling, for kstatus", func() {
		notReady := func(reason string) metav1.Condition {
			return metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: reason}
		}
		done := metav1.Condition{Type: "Progressing", Status: metav1.ConditionFalse, Reason: "RolloutComplete"}
		ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "AllReplicasReady"}

		DescribeTable("is Stalled, never Reconciling, when the fleet needs someone's help",
			func(ready, database, progressing metav1.Condition, reason string) {
				stalled := Stalled(7, ready, database, progressing)
				Expect(stalled).To(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", reason), HaveField("ObservedGeneration", int64(7))))
				Expect(Reconciling(7, ready, progressing, stalled).Status).To(Equal(metav1.ConditionFalse))
			},
			Entry("another object holds a child's name", notReady("ResourceConflict"), reachable, done, "ResourceConflict"),
			Entry("a Secret is missing", notReady("SecretNotFound"), reachable, done, "SecretNotFound"),
			Entry("the table does not fit the mapping", notReady("TableNotUsable"),
				metav1.Condition{Type: "DatabaseReachable", Status: metav1.ConditionFalse, Reason: "TableNotUsable"}, done, "TableNotUsable"),
			Entry("the rollout gave up", notReady("ReplicasNotReady"), reachable,
				metav1.Condition{Type: "Progressing", Status: metav1.ConditionFalse, Reason: "ProgressDeadlineExceeded"}, "ProgressDeadlineExceeded"),
		)

		DescribeTable("is Reconciling while the fleet gets there on its own",
			func(ready, database, progressing metav1.Condition, reason string) {
				stalled := Stalled(7, ready, database, progressing)
				Expect(stalled.Status).To(Equal(metav1.ConditionFalse))
				Expect(Reconciling(7, ready, progressing, stalled)).To(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", reason)))
			},
			Entry("rolling out", notReady("ReplicasNotReady"), reachable, metav1.Condition{Type: "Progressing", Status: metav1.ConditionTrue, Reason: "RollingOut"}, "RollingOut"),
			Entry("drainers starting", notReady("ReplicasNotReady"), reachable, done, "ReplicasNotReady"),
			Entry("the database is down for now", notReady("DatabaseUnreachable"),
				metav1.Condition{Type: "DatabaseReachable", Status: metav1.ConditionFalse, Reason: "ConnectionFailed"}, done, "DatabaseUnreachable"),
		)

		It("is neither when the fleet is ready, paused or scaled to zero, as asked", func() {
			for _, r := range []metav1.Condition{ready, notReady("Paused"), notReady("ScaledToZero")} {
				stalled := Stalled(7, r, reachable, done)
				Expect(stalled.Status).To(Equal(metav1.ConditionFalse))
				Expect(Reconciling(7, r, done, stalled).Status).To(Equal(metav1.ConditionFalse))
			}
		})
	})

	Describe("Progressing", func() {
		DescribeTable("is True while the Deployment rolls out or scales",
			func(change func(*appsv1.Deployment)) {
				f := fleet(3)
				change(f.Deployment)
				Expect(Progressing(f)).To(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "RollingOut"),
					HaveField("ObservedGeneration", int64(7))))
			},
			Entry("the Deployment controller has not seen the new spec", func(d *appsv1.Deployment) { d.Generation = 5 }),
			Entry("some pods run the old template", func(d *appsv1.Deployment) { d.Status.UpdatedReplicas = 2 }),
			Entry("old pods are still terminating", func(d *appsv1.Deployment) { d.Status.Replicas = 4 }),
			Entry("a new pod is not available yet", func(d *appsv1.Deployment) { d.Status.AvailableReplicas = 2 }),
		)

		It("is False once the rollout is complete", func() {
			Expect(Progressing(fleet(3))).To(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "RolloutComplete")))
		})

		It("is False with the Deployment's message once the rollout has timed out", func() {
			f := fleet(3)
			f.Deployment = timedOut(f.Deployment)
			f.Deployment.Status.AvailableReplicas = 1
			Expect(Progressing(f)).To(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "ProgressDeadlineExceeded"),
				HaveField("Message", ContainSubstring("timed out progressing"))))
		})

		It("is Unknown when the Deployment could not be applied", func() {
			f := fleet(3)
			f.Deployment = nil
			Expect(Progressing(f).Status).To(Equal(metav1.ConditionUnknown))
		})
	})

	Describe("Degraded", func() {
		It("is False when nothing needs attention", func() {
			Expect(Degraded(fleet(3), 0)).To(Equal(metav1.Condition{Type: "Degraded", Status: metav1.ConditionFalse,
				ObservedGeneration: 7, Reason: "AsExpected"}))
		})

		It("says how many rows are poisoned", func() {
			Expect(Degraded(fleet(3), 12)).To(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "PoisonedRows"),
				HaveField("Message", ContainSubstring("12 rows reached maxAttempts"))))
		})

		It("puts a failed apply before a stuck rollout, and a stuck rollout before poisoned rows", func() {
			f := fleet(3)
			f.Deployment = timedOut(f.Deployment)
			Expect(Degraded(f, 12).Reason).To(Equal("ProgressDeadlineExceeded"))
			f.ApplyError = errors.New(`create or update Service orders-metrics: forbidden`)
			Expect(Degraded(f, 12)).To(And(HaveField("Reason", "ReconcileFailed"), HaveField("Message", ContainSubstring("forbidden"))))
		})
	})

	Describe("Warnings", func() {
		secretMissing := []metav1.Condition{
			{Type: "DatabaseReachable", Status: metav1.ConditionFalse, Reason: "SecretNotFound", Message: "m"},
			{Type: "Ready", Status: metav1.ConditionFalse, Reason: "SecretNotFound", Message: "m"},
			{Type: "Degraded", Status: metav1.ConditionFalse, Reason: "AsExpected"},
		}

		It("warn once per reason a condition has just taken", func() {
			Expect(Warnings(nil, secretMissing)).To(ConsistOf(HaveField("Reason", "SecretNotFound")))
		})

		It("do not repeat while the reason stays", func() {
			Expect(Warnings(secretMissing, secretMissing)).To(BeEmpty())
		})

		It("warn again when the failure changes", func() {
			after := []metav1.Condition{{Type: "DatabaseReachable", Status: metav1.ConditionFalse, Reason: "ConnectionFailed", Message: "refused"}}
			Expect(Warnings(secretMissing, after)).To(ConsistOf(HaveField("Reason", "ConnectionFailed")))
		})

		It("are not raised by a recovery or by a normal rollout", func() {
			after := []metav1.Condition{
				{Type: "DatabaseReachable", Status: metav1.ConditionTrue, Reason: "OutboxRead"},
				{Type: "Ready", Status: metav1.ConditionFalse, Reason: "ReplicasNotReady"},
				{Type: "Progressing", Status: metav1.ConditionTrue, Reason: "RollingOut"},
			}
			Expect(Warnings(secretMissing, after)).To(BeEmpty())
		})
	})
})
