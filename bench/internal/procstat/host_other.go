//go:build !linux

package procstat

import "github.com/prometheus/procfs"

// cpuModel is unknown outside Linux: procfs reads /proc/cpuinfo there only.
func cpuModel(procfs.FS) string { return "" }
