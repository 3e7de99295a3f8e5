//go:build !unix

package devcluster

import "os"

// Where there is no SIGUSR2, ProcCluster.LameDuck sends an interrupt,
// which a node process takes as a plain shutdown: it does not catch
// lameDuckSignal (canLameDuck).
var lameDuckSignal = os.Interrupt

const canLameDuck = false
