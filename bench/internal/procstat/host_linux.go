package procstat

import "github.com/prometheus/procfs"

func cpuModel(fs procfs.FS) string {
	if infos, err := fs.CPUInfo(); err == nil && len(infos) > 0 {
		return infos[0].ModelName
	}
	return ""
}
