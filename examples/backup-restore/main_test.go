package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestRun plays the example and checks that its narrative tells the story
// the example exists for: the restore waits for the backup's lock and gets
// a larger token, the paused backup's write with its old token is
// rejected, and the restore's data stays.
func TestRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	// A safety net, not a budget: the run waits on events only, and a
	// busy machine may take minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	err := run(ctx, &out)
	t.Logf("run took %v; narrative:\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	text := out.String()

	token := func(re string) uint64 {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("narrative has no line matching %q", re)
		}
		n, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	t1 := token(`backup\s+acquired lock:backup:user123: token (\d+)`)
	t2 := token(`restore\s+acquired lock:backup:user123 after [\d.]+s: token (\d+)`)
	if t2 <= t1 {
		t.Errorf("restore's token %d is not larger than the backup's %d", t2, t1)
	}
	if got := token(`locked by backup-service \(token (\d+)\)`); got != t1 {
		t.Errorf("restore saw the lock held with token %d, want the backup's %d", got, t1)
	}
	rejected := `store    REJECTED the backup's write: token ` + strconv.FormatUint(t1, 10) +
		` is stale, token ` + strconv.FormatUint(t2, 10) + ` was already accepted`
	for _, want := range []string{
		rejected,
		`sees lease.Lost() closed`,
		`user123: content "photos v1", latest backup backup-1; stale writes rejected by the store: 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("narrative lacks %q", want)
		}
	}
	// The rejection comes after the restore's accepted write.
	if r, w := strings.Index(text, rejected), strings.Index(text, "restored user123 to backup-1"); w < 0 || r < w {
		t.Errorf("the rejection (at %d) does not follow the restore's write (at %d)", r, w)
	}
}
