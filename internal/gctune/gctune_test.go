package gctune

import (
	"runtime/debug"
	"testing"
)

// The target is lowered only when GOGC is not set: an operator's GOGC
// (applied by the runtime before main) is left alone.
func TestPercentUnlessGOGCIsSet(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	if !Apply(func(string) (string, bool) { return "", false }) {
		t.Fatal("GOGC unset: Apply did not set the target")
	}
	if got := debug.SetGCPercent(100); got != Percent {
		t.Fatalf("GOGC unset: target %d, want %d", got, Percent)
	}
	if Apply(func(k string) (string, bool) { return "200", k == "GOGC" }) {
		t.Fatal("GOGC=200: Apply set the target")
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GOGC=200: target changed to %d", got)
	}
}
