package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
)

// profileNodes starts a CPU profile of each node of the bench's own
// cluster for phase ph (number n of the run), when --profile asks for
// profiles, and returns a function that waits until they are written:
// DIR/<node>.<n>-<phase>.cpu.pprof. The nodes are profiled through
// nats-server's profiling port for the phase's scheduled length (a phase
// without one is not profiled): a profile cannot be stopped early from
// outside, so a phase that ends sooner is profiled into what follows it.
func (e *env) profileNodes(ctx context.Context, ph *phase, n int) (wait func()) {
	secs := int((ph.sched + time.Second - 1) / time.Second)
	if e.cfg.profileDir == "" || e.cluster == nil || secs == 0 {
		return func() {}
	}
	name := strings.Map(func(r rune) rune {
		if r == ' ' || r == '/' || r == os.PathSeparator {
			return '-'
		}
		return r
	}, ph.Name)
	var wg sync.WaitGroup
	for i := range devcluster.Size {
		url := e.cluster.ProfileURL(i)
		if url == "" {
			continue
		}
		path := filepath.Join(e.cfg.profileDir, fmt.Sprintf("%s.%02d-%s.cpu.pprof", e.cluster.Name(i), n, name))
		wg.Go(func() {
			if err := fetchProfile(ctx, fmt.Sprintf("%sprofile?seconds=%d", url, secs), path, time.Duration(secs)*time.Second+30*time.Second); err != nil {
				fmt.Fprintf(e.out, "profile of %s: %v\n", e.cluster.Name(i), err)
			}
		})
	}
	return wg.Wait
}

// fetchProfile writes what url answers to path, within timeout.
func fetchProfile(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	resp, err := httpGet(ctx, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
