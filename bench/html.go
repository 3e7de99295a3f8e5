package main

import (
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"os"
	"strings"

	"github.com/jetlock/jetlock/bench/internal/load"
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
	title, xLabel, yLabel string
	logY                  bool
	events                []Event
}

const (
	chartW, chartH                 = 860, 280
	padL, padR, padT, padB         = 64, 170, 28, 40
	plotW, plotH                   = chartW - padL - padR, chartH - padT - padB
	minLogMs               float64 = 0.1
)

func esc(s string) string { return template.HTMLEscapeString(s) }

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// axis maps values to one coordinate of the plot.
type axis struct {
	lo, hi float64
	log    bool
	ticks  []float64
}

// yAxis returns the value axis for values in [ymin, ymax] (ymin the
// smallest positive one): decades on a log scale, else quarters from 0.
func yAxis(logY bool, ymin, ymax float64) axis {
	a := axis{log: logY}
	if logY {
		a.lo = math.Pow(10, math.Floor(math.Log10(math.Max(math.Min(ymin, ymax), minLogMs))))
		a.hi = math.Pow(10, math.Ceil(math.Log10(math.Max(ymax, a.lo*10))))
		for t := a.lo; t <= a.hi*1.0001; t *= 10 {
			a.ticks = append(a.ticks, t)
		}
		return a
	}
	a.hi = niceCeil(ymax)
	for i := 0; i <= 4; i++ {
		a.ticks = append(a.ticks, a.hi*float64(i)/4)
	}
	return a
}

// pos returns the y coordinate of v.
func (a axis) pos(v float64) float64 {
	if a.log {
		v = math.Max(v, a.lo)
		return padT + plotH - plotH*(math.Log10(v)-math.Log10(a.lo))/(math.Log10(a.hi)-math.Log10(a.lo))
	}
	return padT + plotH - plotH*v/a.hi
}

// lineChart renders series as an SVG line chart.
func lineChart(o chartOpts, series []chartSeries) string {
	xmax, ymax, ymin, n := 0.0, 0.0, math.Inf(1), 0
	for _, s := range series {
		for _, p := range s.pts {
			if finite(p.V) {
				n++
				xmax, ymax = math.Max(xmax, p.T), math.Max(ymax, p.V)
				if p.V > 0 {
					ymin = math.Min(ymin, p.V)
				}
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
	y := yAxis(o.logY, ymin, ymax)
	xpos := func(t float64) float64 { return padL + plotW*t/xmax }
	drawAxes(&b, o, y, xmax, xpos)
	for _, e := range o.events {
		x := xpos(e.T)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#d62728" stroke-dasharray="4 3"/>`, x, x, padT, padT+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#d62728" font-size="10">%s</text>`, x+3, padT+10, esc(e.What))
	}
	for i, s := range series {
		drawSeries(&b, i, s, y, xpos)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// drawAxes draws the frame, the grid with its labels and the axis names.
func drawAxes(b *strings.Builder, o chartOpts, y axis, xmax float64, xpos func(float64) float64) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`, padL, padT, plotW, plotH)
	for _, t := range y.ticks {
		p := y.pos(t)
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`, padL, padL+plotW, p, p)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-4, p+4, tickLabel(t))
	}
	xstep := niceCeil(xmax / 8)
	for t := 0.0; t <= xmax+1e-9; t += xstep {
		x := xpos(t)
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>`, x, x, padT, padT+plotH)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, padT+plotH+14, tickLabel(t))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`, padL+plotW/2, chartH-6, esc(o.xLabel))
	fmt.Fprintf(b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`, padT+plotH/2, padT+plotH/2, esc(o.yLabel))
}

// drawSeries draws the i-th series and its legend entry.
func drawSeries(b *strings.Builder, i int, s chartSeries, y axis, xpos func(float64) float64) {
	color := s.color
	if color == "" {
		color = palette[i%len(palette)]
	}
	var pts []string
	for _, p := range s.pts {
		if finite(p.V) {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(p.T), y.pos(p.V)))
		}
	}
	dash := ""
	if s.dash {
		dash = ` stroke-dasharray="5 3"`
	}
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.6"%s points="%s"/>`, color, dash, strings.Join(pts, " "))
	ly := padT + 6 + i*15
	fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, padL+plotW+10, padL+plotW+28, ly, ly, color, dash)
	fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`, padL+plotW+32, ly+4, esc(s.name))
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5} {
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
	}
	return fmt.Sprintf("%g", math.Round(v*1000)/1000)
}

func opColor(op string, i int) string {
	switch op {
	case load.OpAcquire, load.OpWaitAcquire:
		return palette[0]
	case load.OpRenew:
		return palette[2]
	case load.OpRelease:
		return palette[1]
	}
	return palette[(i+3)%len(palette)]
}

// phaseCharts draws the latency, rate and CPU charts of one phase.
func phaseCharts(ph *phase) []template.HTML {
	var lat, rate, cpu []chartSeries
	for i, r := range ph.rec.All() {
		var p50, p99, rt []seriesPoint
		for _, p := range r.Points() {
			rt = append(rt, seriesPoint{p.T, p.Rate})
			if p.Count > 0 {
				p50, p99 = append(p50, seriesPoint{p.T, p.P50}), append(p99, seriesPoint{p.T, p.P99})
			}
		}
		c := opColor(r.Name, i)
		lat = append(lat, chartSeries{name: r.Name + " p99", pts: p99, color: c}, chartSeries{name: r.Name + " p50", pts: p50, color: c, dash: true})
		rate = append(rate, chartSeries{name: r.Name, pts: rt, color: c})
	}
	if len(ph.commits) > 0 {
		rate = append(rate, chartSeries{name: "commits", pts: ph.commits, color: "#000", dash: true})
	}
	for i, n := range sortedKeys(ph.cpu, strings.Compare) {
		cpu = append(cpu, chartSeries{name: n, pts: ph.cpu[n], color: palette[i%len(palette)]})
	}
	return []template.HTML{
		template.HTML(lineChart(chartOpts{title: ph.Name + ": latency from intended send time (per second, log scale)", xLabel: "seconds", yLabel: "ms", logY: true, events: ph.Events}, lat)),
		template.HTML(lineChart(chartOpts{title: ph.Name + ": completed operations and commits per second", xLabel: "seconds", yLabel: "per second", events: ph.Events}, rate)),
		template.HTML(lineChart(chartOpts{title: ph.Name + ": CPU (100 = one core)", xLabel: "seconds", yLabel: "%", events: ph.Events}, cpu)),
	}
}

// rampHTML renders a ramp's table and its charts of acquire latency and
// commits against the step rate.
func rampHTML(r *RampResult) htmlPhase {
	var p50, p99, maxs, commits, target []seriesPoint
	var t strings.Builder
	t.WriteString(`<table><tr><th>acquire/s</th><th>achieved</th><th>ops/s</th><th>commits/s</th><th>p50</th><th>p99</th><th>max</th><th>errors</th><th>result</th></tr>`)
	for _, s := range r.Steps {
		p50, p99 = append(p50, seriesPoint{s.TargetRate, s.P50}), append(p99, seriesPoint{s.TargetRate, s.P99})
		maxs, target = append(maxs, seriesPoint{s.TargetRate, s.Max}), append(target, seriesPoint{s.TargetRate, r.P99TargetMs})
		commits = append(commits, seriesPoint{s.TargetRate, s.CommitsPerSec})
		fmt.Fprintf(&t, `<tr><td>%.0f</td><td>%.0f</td><td>%.0f</td><td>%.0f</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%s</td></tr>`,
			s.TargetRate, s.AcquireRate, s.TotalOpsRate, s.CommitsPerSec, fmtMs(s.P50), fmtMs(s.P99), fmtMs(s.Max), s.Errors, esc(passText(s)))
	}
	t.WriteString(`</table>`)
	return htmlPhase{Name: "ramp of " + r.Target, Table: template.HTML(t.String()), Charts: []template.HTML{
		template.HTML(lineChart(chartOpts{title: "ramp of " + r.Target + ": acquire latency by step (log scale)", xLabel: "acquires/s intended", yLabel: "ms", logY: true},
			[]chartSeries{{name: "p50", pts: p50}, {name: "p99", pts: p99}, {name: "max", pts: maxs}, {name: "p99 target", pts: target, dash: true, color: "#888"}})),
		template.HTML(lineChart(chartOpts{title: "ramp of " + r.Target + ": commits per second by step", xLabel: "acquires/s intended", yLabel: "commits/s"},
			[]chartSeries{{name: "commits/s", pts: commits, color: "#000"}})),
	}}
}

type htmlPhase struct {
	Name   string
	Table  template.HTML
	Charts []template.HTML
}

type htmlData struct {
	S       *Summary
	Phases  []htmlPhase
	Results template.HTML
	JSON    string
}

// phaseTable renders a phase's operations as an HTML table.
func phaseTable(ph *phase) template.HTML {
	var b strings.Builder
	b.WriteString(`<table><tr><th>op</th><th>count</th><th>rate/s</th><th>target/s</th><th>p50</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th><th>errors</th></tr>`)
	for _, op := range sortedKeys(ph.Ops, load.OpOrder) {
		s := ph.Ops[op]
		fmt.Fprintf(&b, `<tr><td>%s</td><td>%d</td><td>%.0f</td><td>%.0f</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>`,
			esc(op), s.Count, s.Rate, s.TargetRate, fmtMs(s.P50), fmtMs(s.P95), fmtMs(s.P99), fmtMs(s.P999), fmtMs(s.Max), esc(errorText(s)))
	}
	fmt.Fprintf(&b, `</table><p>commits %.0f/s over %.1fs. %s</p>`, ph.CommitsPerSec, ph.DurationS, esc(procsText(ph.Processes)))
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
<p>Latency is measured from each operation's intended send time on an open-loop schedule, so stalls show as latency (no coordinated omission); closed-loop scenarios (hotlock, cycles) measure from the send.</p>
{{.Results}}
{{range .Phases}}<h2>{{.Name}}</h2>{{.Table}}{{range .Charts}}<div>{{.}}</div>{{end}}{{end}}
<h2>Summary JSON</h2><pre>{{.JSON}}</pre>
</body></html>
`))

// writeHTML writes the HTML report of s to path.
func writeHTML(path string, s *Summary) error {
	var results strings.Builder
	printSummary(&results, s)
	d := htmlData{S: s}
	if strings.TrimSpace(results.String()) != "" {
		d.Results = template.HTML("<h2>Results</h2><pre>" + esc(results.String()) + "</pre>")
	}
	for _, r := range []*RampResult{s.RawRamp, s.Ramp} {
		if r != nil {
			d.Phases = append(d.Phases, rampHTML(r))
		}
	}
	for _, ph := range s.Phases {
		if !ph.compact {
			hp := htmlPhase{Name: ph.Name + " (" + ph.Target + ")", Table: phaseTable(ph)}
			if ph.DurationS >= 3 {
				hp.Charts = phaseCharts(ph)
			}
			d.Phases = append(d.Phases, hp)
		}
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
