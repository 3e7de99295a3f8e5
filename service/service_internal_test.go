package service

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
	"github.com/jetlock/jetlock/streams/devcluster"
)

// startCluster starts a fresh three-node cluster until the test ends.
func startCluster(t *testing.T) *devcluster.Cluster {
	t.Helper()
	cl, err := devcluster.Start(devcluster.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Shutdown)
	return cl
}

// runInternal runs a service with cfg on a fresh three-node cluster until
// the test ends, and returns it with a function that sends one request.
func runInternal(t *testing.T, cfg Config) (*Service, func(op string, body any) *nats.Msg) {
	t.Helper()
	s, _ := startInstance(t, startCluster(t).URLs(), cfg, 0)
	return s, func(op string, body any) *nats.Msg {
		data, _ := json.Marshal(body)
		m, err := s.nc.Request(streams.Subject("jetlock", op), data, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}

// Beyond MaxInFlight requests in progress the service sheds load: it
// answers unavailable at once and changes nothing; once slots are free it
// serves again.
func TestLoadSheddingBeyondMaxInFlight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxInFlight = 4
	s, req := runInternal(t, cfg)
	for range cfg.MaxInFlight {
		s.sem <- struct{}{} // four requests in progress
	}
	m := req(streams.OpAcquire, streams.AcquireRequest{Resource: "shed", RequestID: "r"})
	if code := m.Header.Get(streams.HeaderErrorCode); code != "503" {
		t.Fatalf("acquire beyond the bound answered %q %s, want 503 unavailable", code, m.Data)
	}
	var er streams.ErrorResponse
	if err := json.Unmarshal(m.Data, &er); err != nil || er.Error.Code != streams.CodeUnavailable {
		t.Fatalf("body %s, want code unavailable", m.Data)
	}
	for range cfg.MaxInFlight {
		<-s.sem // the four finish
	}
	m = req(streams.OpStatus, streams.StatusRequest{Resource: "shed"})
	var st streams.StatusResponse
	if m.Header.Get(streams.HeaderErrorCode) != "" || json.Unmarshal(m.Data, &st) != nil || st.Held {
		t.Fatalf("status after the slots freed: %s, want a free resource (the shed acquire changed nothing)", m.Data)
	}
	m = req(streams.OpAcquire, streams.AcquireRequest{Resource: "shed", RequestID: "r"})
	if m.Header.Get(streams.HeaderErrorCode) != "" {
		t.Fatalf("acquire after the slots freed: %s", m.Data)
	}
}
