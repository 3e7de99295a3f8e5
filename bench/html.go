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

// chart is a line chart's frame.
type chart struct {
	title, xLabel, yLabel string
	logY                  bool
	events                []Event
}

const (
	chartW, chartH         = 860, 280
	padL, padR, padT, padB = 64, 170, 28, 40
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
	minLogMs               = 0.1
)

func esc(s string) string { return template.HTMLEscapeString(s) }

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// yAxis returns the value axis for values in [ymin, ymax] (ymin the
// smallest positive one): its ticks, decades on a log scale, else
// quarters from 0, and the y coordinate of a value.
func yAxis(logY bool, ymin, ymax float64) (ticks []float64, pos func(float64) float64) {
	if !logY {
		hi := niceCeil(ymax)
		for i := range 5 {
			ticks = append(ticks, hi*float64(i)/4)
		}
		return ticks, func(v float64) float64 { return padT + plotH - plotH*v/hi }
	}
	lo := math.Pow(10, math.Floor(math.Log10(math.Max(math.Min(ymin, ymax), minLogMs))))
	hi := math.Pow(10, math.Ceil(math.Log10(math.Max(ymax, lo*10))))
	for t := lo; t <= hi*1.0001; t *= 10 {
		ticks = append(ticks, t)
	}
	return ticks, func(v float64) float64 {
		return padT + plotH - plotH*(math.Log10(math.Max(v, lo))-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
}

// render draws series as an SVG line chart: the frame, the grid with its
// labels, the events as dashed red lines, and each series with its legend
// entry.
func (o chart) render(series ...chartSeries) template.HTML {
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
	svg := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	svg(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`, chartW, chartH, chartW, chartH)
	svg(`<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>`, padL, esc(o.title))
	if n == 0 {
		svg(`<text x="%d" y="%d" fill="#888">no data</text></svg>`, padL+10, padT+plotH/2)
		return template.HTML(b.String())
	}
	if xmax <= 0 {
		xmax = 1
	}
	xpos := func(t float64) float64 { return padL + plotW*t/xmax }
	ticks, ypos := yAxis(o.logY, ymin, ymax)
	svg(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`, padL, padT, plotW, plotH)
	for _, t := range ticks {
		svg(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`, padL, padL+plotW, ypos(t), ypos(t))
		svg(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-4, ypos(t)+4, tickLabel(t))
	}
	for t, step := 0.0, niceCeil(xmax/8); t <= xmax+1e-9; t += step {
		svg(`<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>`, xpos(t), xpos(t), padT, padT+plotH)
		svg(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, xpos(t), padT+plotH+14, tickLabel(t))
	}
	svg(`<text x="%d" y="%d" text-anchor="middle">%s</text>`, padL+plotW/2, chartH-6, esc(o.xLabel))
	svg(`<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`, padT+plotH/2, padT+plotH/2, esc(o.yLabel))
	for _, e := range o.events {
		svg(`<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#d62728" stroke-dasharray="4 3"/>`, xpos(e.T), xpos(e.T), padT, padT+plotH)
		svg(`<text x="%.1f" y="%d" fill="#d62728" font-size="10">%s</text>`, xpos(e.T)+3, padT+10, esc(e.What))
	}
	for i, s := range series {
		color, dash := cmpOr(s.color, palette[i%len(palette)]), ""
		if s.dash {
			dash = ` stroke-dasharray="5 3"`
		}
		var pts []string
		for _, p := range s.pts {
			if finite(p.V) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(p.T), ypos(p.V)))
			}
		}
		svg(`<polyline fill="none" stroke="%s" stroke-width="1.6"%s points="%s"/>`, color, dash, strings.Join(pts, " "))
		ly := padT + 6 + i*15
		svg(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, padL+plotW+10, padL+plotW+28, ly, ly, color, dash)
		svg(`<text x="%d" y="%d">%s</text>`, padL+plotW+32, ly+4, esc(s.name))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func cmpOr(s, or string) string {
	if s != "" {
		return s
	}
	return or
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
	if len(ph.raft) > 0 {
		rate = append(rate, chartSeries{name: "raft commits", pts: ph.raft, color: "#888", dash: true})
	}
	for i, n := range sortedKeys(ph.cpu, strings.Compare) {
		cpu = append(cpu, chartSeries{name: n, pts: ph.cpu[n], color: palette[i%len(palette)]})
	}
	return []template.HTML{
		chart{title: ph.Name + ": latency from intended send time (per second, log scale)", xLabel: "seconds", yLabel: "ms", logY: true, events: ph.Events}.render(lat...),
		chart{title: ph.Name + ": completed operations and commits per second", xLabel: "seconds", yLabel: "per second", events: ph.Events}.render(rate...),
		chart{title: ph.Name + ": CPU (100 = one core)", xLabel: "seconds", yLabel: "%", events: ph.Events}.render(cpu...),
	}
}

// htmlTable renders a table whose first row is its head.
func htmlTable(rows [][]string) template.HTML {
	var b strings.Builder
	b.WriteString("<table>")
	for i, row := range rows {
		cell := map[bool]string{true: "th", false: "td"}[i == 0]
		b.WriteString("<tr>")
		for _, v := range row {
			fmt.Fprintf(&b, "<%s>%s</%s>", cell, esc(v), cell)
		}
		b.WriteString("</tr>")
	}
	b.WriteString("</table>")
	return template.HTML(b.String())
}

// rampHTML renders a ramp's table and its charts of acquire latency and
// commits against the step rate.
func rampHTML(r *RampResult) htmlPhase {
	var p50, p99, maxs, commits, target []seriesPoint
	rows := [][]string{{"acquire/s", "achieved", "ops/s", "commits/s", "p50", "p99", "max", "errors", "result"}}
	for _, s := range r.Steps {
		p50, p99 = append(p50, seriesPoint{s.TargetRate, s.P50}), append(p99, seriesPoint{s.TargetRate, s.P99})
		maxs, target = append(maxs, seriesPoint{s.TargetRate, s.Max}), append(target, seriesPoint{s.TargetRate, r.P99TargetMs})
		commits = append(commits, seriesPoint{s.TargetRate, s.CommitsPerSec})
		rows = append(rows, rampRow(s))
	}
	title := "ramp of " + r.Target
	return htmlPhase{Name: title, Table: htmlTable(rows), Charts: []template.HTML{
		chart{title: title + ": acquire latency by step (log scale)", xLabel: "acquires/s intended", yLabel: "ms", logY: true}.render(
			chartSeries{name: "p50", pts: p50}, chartSeries{name: "p99", pts: p99}, chartSeries{name: "max", pts: maxs},
			chartSeries{name: "p99 target", pts: target, dash: true, color: "#888"}),
		chart{title: title + ": commits per second by step", xLabel: "acquires/s intended", yLabel: "commits/s"}.render(
			chartSeries{name: "commits/s", pts: commits, color: "#000"}),
	}}
}

type htmlPhase struct {
	Name   string
	Table  template.HTML
	Charts []template.HTML
}

// phaseTable renders a phase's operations as an HTML table.
func phaseTable(ph *phase) template.HTML {
	rows := [][]string{{"op", "count", "rate/s", "target/s", "p50", "p95", "p99", "p99.9", "max", "errors"}}
	for _, op := range sortedKeys(ph.Ops, load.OpOrder) {
		s := ph.Ops[op]
		rows = append(rows, []string{op, fmt.Sprint(s.Count), fmt.Sprintf("%.0f", s.Rate), fmt.Sprintf("%.0f", s.TargetRate),
			fmtMs(s.P50), fmtMs(s.P95), fmtMs(s.P99), fmtMs(s.P999), fmtMs(s.Max), errorText(s)})
	}
	return htmlTable(rows) + template.HTML(fmt.Sprintf(`<p>%s, over %.1fs. %s</p>`, esc(commitsText(ph)), ph.DurationS, esc(procsText(ph.Processes))))
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
<p>Latency is measured from each operation's intended send time on an open-loop schedule, so stalls show as latency (no coordinated omission); closed-loop scenarios (hotlock, cycles, sets, semaphore, election) measure from the send.</p>
{{with .Results}}<h2>Results</h2><pre>{{.}}</pre>{{end}}
{{range .Phases}}<h2>{{.Name}}</h2>{{.Table}}{{range .Charts}}<div>{{.}}</div>{{end}}{{end}}
<h2>Summary JSON</h2><pre>{{.JSON}}</pre>
</body></html>
`))

// writeHTML writes the HTML report of s to path.
func writeHTML(path string, s *Summary) error {
	var results strings.Builder
	printSummary(&results, s)
	d := struct {
		S             *Summary
		Phases        []htmlPhase
		Results, JSON string
	}{S: s}
	if strings.TrimSpace(results.String()) != "" {
		d.Results = results.String()
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
