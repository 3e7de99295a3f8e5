package devcluster

import "testing"

// FreePort draws ports below the system's ephemeral range when it knows
// the range, so that no outgoing connection or port-0 listener can take a
// stopped node's port before it restarts.
func TestFreePortAvoidsTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low == 0 {
		t.Skip("the system does not say its ephemeral port range")
	}
	for range 200 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < minPort || p >= low {
			t.Fatalf("FreePort gave %d, outside [%d, %d)", p, minPort, low)
		}
	}
}
