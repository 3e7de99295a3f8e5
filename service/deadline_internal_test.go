package service

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A request's context ends budget to budget+deadlineStep after its
// receipt, requests received together share one, and one received
// earlier (it waited in the queue) ends earlier.
func TestDeadlines(t *testing.T) {
	const budget = 200 * time.Millisecond
	d := newDeadlines(budget)
	start := time.Now()
	ctx := d.get(start)
	dl, ok := ctx.Deadline()
	if !ok {
		t.Fatal("no deadline")
	}
	if dl.Before(start.Add(budget)) || dl.After(start.Add(budget+deadlineStep)) {
		t.Fatalf("deadline %v after receipt, want %v to %v", dl.Sub(start), budget, budget+deadlineStep)
	}

	// A request that waited 150ms keeps only the rest of the budget.
	waited := start.Add(-150 * time.Millisecond)
	early, _ := d.get(waited).Deadline()
	if early.Before(waited.Add(budget)) || early.After(waited.Add(budget+deadlineStep)) {
		t.Fatalf("deadline of a request received 150ms earlier: %v after its receipt, want %v to %v", early.Sub(waited), budget, budget+deadlineStep)
	}

	distinct := map[context.Context]bool{}
	for range 1000 {
		distinct[d.get(time.Now())] = true
	}
	if elapsed := time.Since(start); len(distinct) > int(elapsed/deadlineStep)+2 {
		t.Fatalf("%d contexts for 1000 requests in %v, want one per %v step", len(distinct), elapsed, deadlineStep)
	}
	// Around a step's end requests are handled slightly out of receipt
	// order: the previous step's context is still shared.
	now := time.Now()
	a, b := d.get(now), d.get(now.Add(deadlineStep))
	if a2, b2 := d.get(now), d.get(now.Add(deadlineStep)); a2 != a || b2 != b || a == b {
		t.Fatal("two adjacent steps asked for alternately do not keep one context each")
	}

	<-ctx.Done()
	if took := time.Since(start); took < budget {
		t.Fatalf("ended after %v, before its budget %v", took, budget)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("ended with %v", ctx.Err())
	}
	if late := d.get(time.Now()); late == ctx {
		t.Fatal("a request after the deadline got the ended context")
	}
}
