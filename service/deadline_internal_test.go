package service

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A request's context ends timeout to timeout+deadlineStep after it was
// handed out, and requests started together share one.
func TestDeadlines(t *testing.T) {
	const timeout = 200 * time.Millisecond
	d := newDeadlines(timeout)
	start := time.Now()
	ctx := d.get()
	dl, ok := ctx.Deadline()
	if !ok {
		t.Fatal("no deadline")
	}
	if dl.Before(start.Add(timeout)) || dl.After(time.Now().Add(timeout+deadlineStep)) {
		t.Fatalf("deadline %v after the request, want %v to %v", dl.Sub(start), timeout, timeout+deadlineStep)
	}

	distinct := map[context.Context]bool{}
	for range 1000 {
		distinct[d.get()] = true
	}
	if elapsed := time.Since(start); len(distinct) > int(elapsed/deadlineStep)+2 {
		t.Fatalf("%d contexts for 1000 requests in %v, want one per %v step", len(distinct), elapsed, deadlineStep)
	}

	<-ctx.Done()
	if took := time.Since(start); took < timeout {
		t.Fatalf("ended after %v, before its timeout %v", took, timeout)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("ended with %v", ctx.Err())
	}
	if late := d.get(); late == ctx {
		t.Fatal("a request after the deadline got the ended context")
	}
}
