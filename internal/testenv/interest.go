package testenv

import (
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
)

// WaitInterest waits until every running node knows of a subscription
// matching subject in account (devcluster.Account for what the service
// publishes, such as election events): interest spreads between nodes
// asynchronously, and a message published before it arrives is dropped.
// A subscriber calls it after subscribing, before causing what it watches.
func (e *Env) WaitInterest(account, subject string) {
	e.T.Helper()
	for i := range devcluster.Size {
		srv := e.Cluster.Server(i)
		if srv == nil {
			continue
		}
		acc, err := srv.LookupAccount(account)
		if err != nil {
			e.T.Fatalf("account %s on node %d: %v", account, i, err)
		}
		Eventually(e.T, 30*time.Second, func() bool { return acc.SubscriptionInterest(subject) }, "interest in %s (account %s) on node %d", subject, account, i)
	}
}

// WaitReachable waits until a request sent through every node reaches a
// service instance, for an instance Serve did not start (lockd's, in its
// own tests): interest in the request subjects spreads between nodes
// asynchronously.
func (e *Env) WaitReachable() {
	e.T.Helper()
	e.waitReachable()
}
