package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/client/fence"
)

// rejected gathers reg and returns jetlock_fence_rejected_total by guard.
func rejected(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != fence.RejectedMetric {
			t.Fatalf("unexpected metric %s", mf.GetName())
		}
		if mf.GetHelp() == "" || mf.GetType().String() != "COUNTER" {
			t.Fatalf("%s: help %q, type %v; want help and COUNTER", mf.GetName(), mf.GetHelp(), mf.GetType())
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "guard" {
				t.Fatalf("labels %v, want guard only", m.GetLabel())
			}
			out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return out
}

// The collector exports each guard's rejections under its name, reads them
// at every scrape, and passes the pedantic registry's consistency checks.
func TestCollectorExportsRejections(t *testing.T) {
	ctx := context.Background()
	orders, users := fence.NewMemory(), fence.NewMemory()
	guards := map[string]fence.Rejecter{"orders": orders, "users": users}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(fence.NewCollector(guards)); err != nil {
		t.Fatal(err)
	}
	delete(guards, "users") // the collector keeps its own copy
	if got := rejected(t, reg); len(got) != 2 || got["orders"] != 0 || got["users"] != 0 {
		t.Fatalf("before any rejection: %v, want orders 0, users 0", got)
	}
	if err := orders.Check(ctx, "r", 5); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []uint64{4, 3} {
		if err := orders.Check(ctx, "r", tok); !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("Check(%d) = %v, want ErrStaleToken", tok, err)
		}
	}
	if err := users.Check(ctx, "u", 2); err != nil {
		t.Fatal(err)
	}
	if err := users.Check(ctx, "u", 1); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatal(err)
	}
	if got := rejected(t, reg); got["orders"] != 2 || got["users"] != 1 {
		t.Fatalf("after rejections: %v, want orders 2, users 1", got)
	}
	// A second collector with the same metric and guard name is refused,
	// as Prometheus requires.
	if err := reg.Register(fence.NewCollector(map[string]fence.Rejecter{"orders": orders})); err == nil {
		t.Fatal("registering a duplicate collector succeeded")
	}
}

// A collector of no guards is valid and exports nothing.
func TestCollectorEmpty(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(fence.NewCollector(nil))
	if got := rejected(t, reg); len(got) != 0 {
		t.Fatalf("got %v, want nothing", got)
	}
}
