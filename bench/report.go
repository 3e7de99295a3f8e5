package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/bench/internal/procstat"
)

// Summary is the one object --json writes. Ops, CommitsPerSec, CPU and
// Processes are those of the scenario's main phase: the measured phase of
// steady, failover, degraded, rolling and cycles, the service phase of raw, the
// highest step that met the target of ramp (of the service ramp in all),
// the waiting phase of hotlock and of semaphore, the uncontended phase of
// sets, the election's phase. Every phase is listed under phases.
type Summary struct {
	Scenario      string                      `json:"scenario"`
	Started       time.Time                   `json:"started"`
	Command       string                      `json:"command"`
	Machine       Machine                     `json:"machine"`
	Settings      map[string]string           `json:"settings"`
	Ops           map[string]load.OpSummary   `json:"ops"`
	CommitsPerSec float64                     `json:"commits_per_s"`
	CPU           *CPUCost                    `json:"cpu_per_op,omitempty"`
	Processes     map[string]procstat.Summary `json:"processes"`
	Phases        []*phase                    `json:"phases"`
	Ramp          *RampResult                 `json:"ramp,omitempty"`
	RawRamp       *RampResult                 `json:"raw_ramp,omitempty"`
	Overhead      *Overhead                   `json:"overhead,omitempty"`
	Hotlock       *HotlockResult              `json:"hotlock,omitempty"`
	Failover      *FailoverResult             `json:"failover,omitempty"`
	Cycles        *CyclesResult               `json:"cycles,omitempty"`
	Degraded      *DegradedResult             `json:"degraded,omitempty"`
	Overload      *OverloadResult             `json:"overload,omitempty"`
	Noisy         *NoisyResult                `json:"noisy,omitempty"`
	Sessions      *SessionsResult             `json:"sessions,omitempty"`
	Sets          *SetsResult                 `json:"sets,omitempty"`
	Semaphore     *SemaphoreResult            `json:"semaphore,omitempty"`
	Election      *ElectionResult             `json:"election,omitempty"`
	Waiters       *WaitersResult              `json:"waiters,omitempty"`
	Rolling       *RollingResult              `json:"rolling,omitempty"`
	Safety        *load.SafetyResult          `json:"safety,omitempty"`
	// ErrorMessages are the kinds of message of the unavailable and
	// internal answers, by code, numbers masked: why the service refused.
	ErrorMessages map[string][]load.ErrorSample `json:"error_messages,omitempty"`
	Notes         []string                      `json:"notes,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	Cores   int    `json:"cores"`
	CPU     string `json:"cpu"`
	MemGB   int    `json:"mem_gb"`
	OS      string `json:"os"`
	Go      string `json:"go"`
	Cluster string `json:"cluster"`
	Service string `json:"service"`
	// ServiceServer is the node the in-process service is connected to,
	// and StreamLeader the node leading the lock stream when the run
	// began: each write crosses a route when they differ, which costs
	// CPU on a small machine.
	ServiceServer string `json:"service_server,omitempty"`
	StreamLeader  string `json:"stream_leader,omitempty"`
}

func machineInfo() Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version()}
	cpu, mem := procstat.Host()
	m.CPU, m.MemGB = cpu, int((mem+1<<29)>>30)
	return m
}

// use makes ph the summary's main phase.
func (s *Summary) use(ph *phase) {
	s.Ops, s.CommitsPerSec, s.CPU, s.Processes = ph.Ops, ph.CommitsPerSec, ph.CPU, ph.Processes
}

// check runs the safety check of log (nil: none) into the summary, and
// returns an error when it found a violation.
func (s *Summary) check(log *load.GrantLog) error {
	if log == nil {
		return nil
	}
	r := log.Check()
	s.Safety = &r
	if r.Violations > 0 {
		return fmt.Errorf("%s: %d safety violations", s.Scenario, r.Violations)
	}
	return nil
}

// writeJSON writes the summary to path.
func writeJSON(path string, s *Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// printPhase prints one phase as a table and what else was measured.
func printPhase(w io.Writer, ph *phase) {
	fmt.Fprintf(w, "\n== %s (%s, %.1fs) ==\n", ph.Name, ph.Target, ph.DurationS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tcount\trate/s\ttarget/s\tp50\tp95\tp99\tmax\terrors\t")
	for _, op := range sortedKeys(ph.Ops, load.OpOrder) {
		s := ph.Ops[op]
		if s.Count == 0 && s.Skipped == 0 && s.TargetRate == 0 {
			continue
		}
		target := "-"
		if s.TargetRate > 0 {
			target = fmt.Sprintf("%.0f", s.TargetRate)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", op, s.Count, s.Rate, target,
			fmtMs(s.P50), fmtMs(s.P95), fmtMs(s.P99), fmtMs(s.Max), errorText(s))
	}
	tw.Flush()
	fmt.Fprintln(w, commitsText(ph))
	if c := ph.CPU; c != nil && costText(c) != "" {
		fmt.Fprintf(w, "cpu per op: %s over %d answered ops and %d commits\n", costText(c), c.Answered, c.Commits)
	}
	if len(ph.ServiceMs) > 0 {
		var parts []string
		for _, op := range sortedKeys(ph.ServiceMs, strings.Compare) {
			parts = append(parts, fmt.Sprintf("%s %s", op, fmtMs(ph.ServiceMs[op])))
		}
		fmt.Fprintf(w, "service's own mean time, receipt to reply: %s\n", strings.Join(parts, ", "))
	}
	if len(ph.ServiceCommitMs) > 0 {
		var parts []string
		for _, op := range sortedKeys(ph.ServiceCommitMs, strings.Compare) {
			parts = append(parts, fmt.Sprintf("%s %s (%d)", op, fmtMs(ph.ServiceCommitMs[op]), ph.ServiceCommits[op]))
		}
		fmt.Fprintf(w, "service's writes to the bucket, mean round trip (count): %s; compare-and-set races decided again: %d\n",
			strings.Join(parts, ", "), ph.ServiceConflicts)
	}
	if ph.ServiceShed != nil {
		fmt.Fprintf(w, "service shed (answered unavailable unprocessed): %d after waiting in its queue, %d with its queue full, %d while renewals went first\n",
			ph.ServiceShed["waited"], ph.ServiceShed["queue_full"], ph.ServiceShed["renewals"])
	}
	fmt.Fprint(w, procsText(ph.Processes))
	if m := ph.Machine; m != nil {
		fmt.Fprintln(w, machineText(m))
	}
	for _, e := range ph.Events {
		fmt.Fprintf(w, "event at %.1fs: %s\n", e.T, e.What)
	}
}

// commitsText renders a phase's commits (stream messages) and raft
// commits per second.
func commitsText(ph *phase) string {
	if ph.RaftRead {
		return fmt.Sprintf("commits: %.0f/s (stream messages); raft commits: %.0f/s (appends of the stream's raft group, %.1f messages each)",
			ph.CommitsPerSec, ph.RaftCommitsPerSec, ratio(ph.CommitsPerSec, ph.RaftCommitsPerSec))
	}
	return fmt.Sprintf("commits: %.0f/s (stream messages)", ph.CommitsPerSec)
}

// costText renders the CPU costs that were measured.
func costText(c *CPUCost) string {
	var parts []string
	if c.ServiceUsPerOp > 0 {
		name := "service"
		if c.ServiceProcess != "service" {
			name += " (" + c.ServiceProcess + ")"
		}
		parts = append(parts, fmt.Sprintf("%s %.0fµs/op (%.0fµs/commit)", name, c.ServiceUsPerOp, c.ServiceUsPerCommit))
	}
	if c.ClusterUsPerOp > 0 {
		parts = append(parts, fmt.Sprintf("cluster %.0fµs/op (%.0fµs/commit)", c.ClusterUsPerOp, c.ClusterUsPerCommit))
	}
	return strings.Join(parts, ", ")
}

func machineText(m *procstat.MachineCPU) string {
	return fmt.Sprintf("machine (%d cores): %.0f%% busy, %.0f%% iowait, %.0f%% idle, %.1f%% stolen by the hypervisor",
		m.Cores, m.BusyPct, m.IOWaitPct, m.IdlePct, m.StealPct)
}

func errorText(s load.OpSummary) string {
	if s.Errors == 0 {
		if s.Skipped > 0 {
			return fmt.Sprintf("0 (skipped %d)", s.Skipped)
		}
		return "0"
	}
	var parts []string
	for _, c := range sortedKeys(s.ErrorsByCode, strings.Compare) {
		parts = append(parts, fmt.Sprintf("%s:%d", c, s.ErrorsByCode[c]))
	}
	return fmt.Sprintf("%d (%s)", s.Errors, strings.Join(parts, " "))
}

func procsText(ps map[string]procstat.Summary) string {
	if len(ps) == 0 {
		return ""
	}
	var parts []string
	for _, n := range sortedKeys(ps, strings.Compare) {
		p := ps[n]
		s := fmt.Sprintf("%s %.0f%% cpu %.0f MB (peak %.0f)", n, p.CPUPct, p.RSSMB, p.PeakMB)
		if p.Restarts > 0 {
			s += fmt.Sprintf(" restarted %d", p.Restarts)
		}
		parts = append(parts, s)
	}
	return "processes: " + strings.Join(parts, "; ") + "\n"
}

// printSummary prints the scenario's results after the phases.
func printSummary(w io.Writer, s *Summary) {
	for _, r := range []*RampResult{s.RawRamp, s.Ramp} {
		if r != nil {
			printRamp(w, r)
		}
	}
	if o := s.Overhead; o != nil {
		fmt.Fprintf(w, "\n== service overhead over raw KV compare-and-set ==\n%s\n", o.Text)
	}
	if s.Hotlock != nil {
		printHotlock(w, s.Hotlock)
	}
	if s.Failover != nil {
		printFailover(w, s.Failover)
	}
	if s.Cycles != nil {
		printCycles(w, s.Cycles)
	}
	if s.Rolling != nil {
		printRolling(w, s.Rolling)
	}
	if s.Degraded != nil {
		printDegraded(w, s.Degraded)
	}
	if s.Overload != nil {
		printOverload(w, s.Overload)
	}
	if s.Noisy != nil {
		printNoisy(w, s.Noisy)
	}
	if s.Sessions != nil {
		printSessions(w, s.Sessions)
	}
	if s.Sets != nil {
		printSets(w, s.Sets)
	}
	if s.Semaphore != nil {
		printSemaphore(w, s.Semaphore)
	}
	if s.Election != nil {
		printElection(w, s.Election)
	}
	if s.Waiters != nil {
		printWaiters(w, s.Waiters)
	}
	if sf := s.Safety; sf != nil && sf.Checked {
		fmt.Fprintf(w, "\nsafety: %d grants on %d resources checked, %d violations\n", sf.Grants, sf.Resources, sf.Violations)
		for _, e := range sf.Examples {
			fmt.Fprintf(w, "  VIOLATION %s\n", e)
		}
	}
	for _, code := range slices.Sorted(maps.Keys(s.ErrorMessages)) {
		fmt.Fprintf(w, "\n%s answers, by message:\n", code)
		for _, e := range s.ErrorMessages[code] {
			fmt.Fprintf(w, "  %8d  %s\n", e.Count, e.Message)
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}
