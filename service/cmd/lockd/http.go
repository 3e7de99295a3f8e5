package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	httppprof "net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jetlock/jetlock/service"
)

// healthStale is how old the service's last stream check may be before
// /readyz stops trusting it: the check runs every second and each of its
// requests is bounded by 2s, so a check older than this means the checker
// itself is stuck.
const healthStale = 15 * time.Second

// healthSource is what /readyz asks: *service.Service.
type healthSource interface {
	Health() service.Health
}

// newHTTPHandler serves the operations endpoints of --metrics:
//
//   - GET /metrics: the Prometheus metrics of reg.
//   - GET /healthz: 200 "ok" while the process runs (liveness; it does not
//     depend on NATS, so a cluster outage does not get lockd restarted).
//   - GET /readyz: 200 and svc.Health() as JSON when the instance is ready
//     (the bucket's stream has a leader and a quorum of current replicas,
//     its configuration is as required, its sequence is not below the
//     token high-water mark, no permission error in the last minute, the
//     instance serves); otherwise 503 and the same JSON with the problems.
//   - /debug/pprof/: the runtime's profiles, only with pprof set.
func newHTTPHandler(reg prometheus.Gatherer, svc healthSource, pprof bool) http.Handler {
	mux := http.NewServeMux()
	if pprof {
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		h := readiness(svc.Health(), time.Now())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !h.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
	return mux
}

// readiness returns h, not ready when its check is older than healthStale.
func readiness(h service.Health, now time.Time) service.Health {
	if age := now.Sub(h.Checked); h.Ready && age > healthStale {
		h.Ready = false
		h.Problems = append(h.Problems[:len(h.Problems):len(h.Problems)],
			fmt.Sprintf("the last stream check is %v old", age.Round(time.Second)))
	}
	return h
}
