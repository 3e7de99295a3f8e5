package main

import (
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"os"
	"sort"
	"strings"
)

// The HTML report is one self-contained file: tables and inline SVG
// charts drawn here, no scripts, no external resources.

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"}

// chartSeries is one line of a chart.
type chartSeries struct {
	name  string
	pts   []seriesPoint
	dash  bool
	color string
}

type chartOpts struct {
	title  string
	xLabel string
	yLabel string
	logY   bool
	events []Event
}

const (
	chartW, chartH                 = 860, 280
	padL, padR, padT, padB         = 64, 170, 28, 40
	plotW, plotH                   = chartW - padL - padR, chartH - padT - padB
	minLogMs               float64 = 0.1
)

func esc(s string) string { return template.HTMLEscapeString(s) }

// lineChart renders series as an SVG line chart.
func lineChart(o chartOpts, series []chartSeries) string {
	var xmax, ymax float64
	ymin := math.Inf(1)
	n := 0
	for _, s := range series {
		for _, p := range s.pts {
			if math.IsNaN(p.V) || math.IsInf(p.V, 0) {
				continue
			}
			n++
			xmax = math.Max(xmax, p.T)
			ymax = math.Max(ymax, p.V)
			if p.V > 0 {
				ymin = math.Min(ymin, p.V)
			}
		}
	}
	for _, e := range o.events {
		xmax = math.Max(xmax, e.T)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`, chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>`, padL, esc(o.title))
	if n == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#888">no data</text></svg>`, padL+10, padT+plotH/2)
		return b.String()
	}
	if xmax <= 0 {
		xmax = 1
	}
	// Y scale.
	var ylo, yhi float64
	var ticks []float64
	if o.logY {
		ylo = math.Pow(10, math.Floor(math.Log10(math.Max(math.Min(ymin, ymax), minLogMs))))
		yhi = math.Pow(10, math.Ceil(math.Log10(math.Max(ymax, ylo*10))))
		for t := ylo; t <= yhi*1.0001; t *= 10 {
			ticks = append(ticks, t)
		}
	} else {
		yhi = niceCeil(ymax)
		for i := 0; i <= 4; i++ {
			ticks = append(ticks, yhi*float64(i)/4)
		}
	}
	ypos := func(v float64) float64 {
		if o.logY {
			v = math.Max(v, ylo)
			return padT + plotH - plotH*(math.Log10(v)-math.Log10(ylo))/(math.Log10(yhi)-math.Log10(ylo))
		}
		return padT + plotH - plotH*v/yhi
	}
	xpos := func(t float64) float64 { return padL + plotW*t/xmax }
	// Axes and grid.
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`, padL, padT, plotW, plotH)
	for _, t := range ticks {
		y := ypos(t)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`, padL, padL+plotW, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-4, y+4, tickLabel(t))
	}
	xstep := niceCeil(xmax / 8)
	for t := 0.0; t <= xmax+1e-9; t += xstep {
		x := xpos(t)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>`, x, x, padT, padT+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, padT+plotH+14, tickLabel(t))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`, padL+plotW/2, chartH-6, esc(o.xLabel))
	fmt.Fprintf(&b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`, padT+plotH/2, padT+plotH/2, esc(o.yLabel))
	// Events.
	for _, e := range o.events {
		x := xpos(e.T)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#d62728" stroke-dasharray="4 3"/>`, x, x, padT, padT+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#d62728" font-size="10">%s</text>`, x+3, padT+10, esc(e.What))
	}
	// Lines and legend.
	for i, s := range series {
		color := s.color
		if color == "" {
			color = palette[i%len(palette)]
		}
		var pts []string
		for _, p := range s.pts {
			if math.IsNaN(p.V) || math.IsInf(p.V, 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(p.T), ypos(p.V)))
		}
		dash := ""
		if s.dash {
			dash = ` stroke-dasharray="5 3"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.6"%s points="%s"/>`, color, dash, strings.Join(pts, " "))
		ly := padT + 6 + i*15
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, padL+plotW+10, padL+plotW+28, ly, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`, padL+plotW+32, ly+4, esc(s.name))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func tickLabel(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%gk", v/1e3)
	default:
		return fmt.Sprintf("%g", math.Round(v*1000)/1000)
	}
}

func opColor(op string, i int) string {
	switch op {
	case opAcquire, opWaitAcquire:
		return palette[0]
	case opRenew:
		return palette[2]
	case opRelease:
		return palette[1]
	}
	return palette[(i+3)%len(palette)]
}

// phaseCharts draws the latency, rate and CPU charts of one phase.
func phaseCharts(ph *phase) []template.HTML {
	var lat, rate []chartSeries
	for i, r := range ph.rec.all() {
		pts := r.points()
		var p50, p99, rt []seriesPoint
		for _, p := range pts {
			rt = append(rt, seriesPoint{p.T, p.Rate})
			if p.Count > 0 {
				p50 = append(p50, seriesPoint{p.T, p.P50})
				p99 = append(p99, seriesPoint{p.T, p.P99})
			}
		}
		c := opColor(r.name, i)
		lat = append(lat, chartSeries{name: r.name + " p99", pts: p99, color: c}, chartSeries{name: r.name + " p50", pts: p50, color: c, dash: true})
		rate = append(rate, chartSeries{name: r.name, pts: rt, color: c})
	}
	if len(ph.commits) > 0 {
		rate = append(rate, chartSeries{name: "commits", pts: ph.commits, color: "#000", dash: true})
	}
	var cpu []chartSeries
	var names []string
	for n := range ph.cpu {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		cpu = append(cpu, chartSeries{name: n, pts: ph.cpu[n], color: palette[i%len(palette)]})
	}
	return []template.HTML{
		template.HTML(lineChart(chartOpts{title: ph.Name + ": latency from intended send time (per second, log scale)", xLabel: "seconds", yLabel: "ms", logY: true, events: ph.Events}, lat)),
		template.HTML(lineChart(chartOpts{title: ph.Name + ": completed operations and commits per second", xLabel: "seconds", yLabel: "per second", events: ph.Events}, rate)),
		template.HTML(lineChart(chartOpts{title: ph.Name + ": CPU (100 = one core)", xLabel: "seconds", yLabel: "%", events: ph.Events}, cpu)),
	}
}

// rampChart draws acquire latency and commits against the step rate.
func rampChart(r *RampResult) []template.HTML {
	var p50, p99, max, commits, target []seriesPoint
	for _, s := range r.Steps {
		p50 = append(p50, seriesPoint{s.TargetRate, s.P50})
		p99 = append(p99, seriesPoint{s.TargetRate, s.P99})
		max = append(max, seriesPoint{s.TargetRate, s.Max})
		commits = append(commits, seriesPoint{s.TargetRate, s.CommitsPerSec})
		target = append(target, seriesPoint{s.TargetRate, r.P99TargetMs})
	}
	return []template.HTML{
		template.HTML(lineChart(chartOpts{title: "ramp of " + r.Target + ": acquire latency by step (log scale)", xLabel: "acquires/s intended", yLabel: "ms", logY: true},
			[]chartSeries{{name: "p50", pts: p50}, {name: "p99", pts: p99}, {name: "max", pts: max}, {name: "p99 target", pts: target, dash: true, color: "#888"}})),
		template.HTML(lineChart(chartOpts{title: "ramp of " + r.Target + ": commits per second by step", xLabel: "acquires/s intended", yLabel: "commits/s"},
			[]chartSeries{{name: "commits/s", pts: commits, color: "#000"}})),
	}
}

type htmlPhase struct {
	Name   string
	Table  template.HTML
	Charts []template.HTML
}

type htmlData struct {
	S       *Summary
	Ramps   []htmlPhase
	Phases  []htmlPhase
	Results template.HTML
	JSON    string
}

// phaseTable renders a phase's operations as an HTML table.
func phaseTable(ph *phase) template.HTML {
	var b strings.Builder
	b.WriteString(`<table><tr><th>op</th><th>count</th><th>rate/s</th><th>target/s</th><th>p50</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th><th>errors</th></tr>`)
	var ops []string
	for op := range ph.Ops {
		ops = append(ops, op)
	}
	sort.Slice(ops, func(i, j int) bool { return opOrder(ops[i]) < opOrder(ops[j]) })
	for _, op := range ops {
		s := ph.Ops[op]
		fmt.Fprintf(&b, `<tr><td>%s</td><td>%d</td><td>%.0f</td><td>%.0f</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>`,
			esc(op), s.Count, s.Rate, s.TargetRate, fmtMs(s.P50), fmtMs(s.P95), fmtMs(s.P99), fmtMs(s.P999), fmtMs(s.Max), esc(errorText(s)))
	}
	fmt.Fprintf(&b, `</table><p>commits %.0f/s over %.1fs.`, ph.CommitsPerSec, ph.DurationS)
	var names []string
	for n := range ph.Processes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := ph.Processes[n]
		fmt.Fprintf(&b, ` %s: %.0f%% CPU, %.0f MB RSS (peak %.0f).`, esc(n), p.CPUPct, p.RSSMB, p.PeakMB)
	}
	b.WriteString(`</p>`)
	return template.HTML(b.String())
}

var reportTmpl = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>jetlock bench: {{.S.Scenario}}</title>
<style>
body{font-family:sans-serif;max-width:1000px;margin:20px auto;color:#222}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td:first-child{text-align:left}pre{background:#f8f8f8;padding:8px;overflow-x:auto;font-size:12px}
h2{margin-top:32px;border-bottom:1px solid #ddd}
</style></head><body>
<h1>jetlock bench: {{.S.Scenario}}</h1>
<p>Started {{.S.Started.Format "2006-01-02 15:04:05 MST"}} on {{.S.Machine.Cores}} cores ({{.S.Machine.CPU}}), {{.S.Machine.MemGB}} GB, {{.S.Machine.OS}}, {{.S.Machine.Go}}.<br>
Cluster: {{.S.Machine.Cluster}}. Service: {{.S.Machine.Service}}.<br>
Command: <code>{{.S.Command}}</code></p>
<p>Latency is measured from each operation's intended send time on an open-loop schedule, so stalls show as latency (no coordinated omission).</p>
{{.Results}}
{{range .Ramps}}<h2>{{.Name}}</h2>{{.Table}}{{range .Charts}}<div>{{.}}</div>{{end}}{{end}}
{{range .Phases}}<h2>{{.Name}}</h2>{{.Table}}{{range .Charts}}<div>{{.}}</div>{{end}}{{end}}
<h2>Summary JSON</h2><pre>{{.JSON}}</pre>
</body></html>
`))

// resultsHTML renders the scenario's own results as preformatted text.
func resultsHTML(s *Summary) template.HTML {
	var b strings.Builder
	printSummary(&b, s)
	if strings.TrimSpace(b.String()) == "" {
		return ""
	}
	return template.HTML("<h2>Results</h2><pre>" + esc(b.String()) + "</pre>")
}

// writeHTML writes the HTML report of s to path.
func writeHTML(path string, s *Summary) error {
	d := htmlData{S: s, Results: resultsHTML(s)}
	for _, r := range []*RampResult{s.RawRamp, s.Ramp} {
		if r == nil {
			continue
		}
		hp := htmlPhase{Name: "ramp of " + r.Target, Charts: rampChart(r)}
		var t strings.Builder
		t.WriteString(`<table><tr><th>acquire/s</th><th>achieved</th><th>ops/s</th><th>commits/s</th><th>p50</th><th>p99</th><th>max</th><th>errors</th><th>result</th></tr>`)
		for _, st := range r.Steps {
			fmt.Fprintf(&t, `<tr><td>%.0f</td><td>%.0f</td><td>%.0f</td><td>%.0f</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%s</td></tr>`,
				st.TargetRate, st.AcquireRate, st.TotalOpsRate, st.CommitsPerSec, fmtMs(st.P50), fmtMs(st.P99), fmtMs(st.Max), st.Errors, esc(passText(st)))
		}
		t.WriteString(`</table>`)
		hp.Table = template.HTML(t.String())
		d.Ramps = append(d.Ramps, hp)
	}
	for _, ph := range s.Phases {
		if ph.compact {
			continue
		}
		hp := htmlPhase{Name: ph.Name + " (" + ph.Target + ")", Table: phaseTable(ph)}
		if ph.DurationS >= 3 {
			hp.Charts = phaseCharts(ph)
		}
		d.Phases = append(d.Phases, hp)
	}
	js, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	d.JSON = string(js)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := reportTmpl.Execute(f, d); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
