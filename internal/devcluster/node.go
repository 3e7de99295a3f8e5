package devcluster

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// nodeSpec is everything that makes one node. The server options of a
// node come from it alone, so a node in this process (Start) and a node in
// a process of its own (StartProcs) run with the very same settings; a
// node process receives it as JSON.
type nodeSpec struct {
	Index      int         `json:"index"` // 0..Size-1: name n<Index+1>, zone Zones[Index]
	Dir        string      `json:"dir"`   // the cluster's directory; the node stores in Dir/n<Index+1>
	ClientPort int         `json:"client_port"`
	RoutePort  int         `json:"route_port"`
	Routes     []string    `json:"routes"` // route URLs of the other nodes
	Prefix     string      `json:"prefix"` // the service's subject prefix, imported by the callers
	Creds      credentials `json:"creds,omitempty"`
	// Open drops the accounts and users: every connection lands in the
	// global account with every right, as before the least-privilege model.
	Open bool `json:"open,omitempty"`
	// ProfPort, when not zero, is where the node serves Go's profiles
	// (/debug/pprof/ on loopback).
	ProfPort int `json:"prof_port,omitempty"`
}

// The lame duck settings of every node: those of deploy/nats/common.conf
// (and of the NATS Helm chart), so that a node stopped in lame duck mode
// (ProcCluster.LameDuck) stops as a deployed server does. In lame duck
// mode a server hands the leadership of its raft groups to a peer, stops
// JetStream a second later, keeps its clients for the grace period, and
// then closes them, spread over the rest of the duration.
const (
	LameDuckDuration    = 30 * time.Second
	LameDuckGracePeriod = 10 * time.Second
)

// nodeName returns the server name of node i.
func nodeName(i int) string { return fmt.Sprintf("n%d", i+1) }

// options returns the node's server options: loopback only, JetStream with
// fsync after every write, its zone tag, unique_tag "az:" so that an R3
// stream puts one replica in each zone, and the accounts of auth.go. A zero
// port means any free port.
func (n nodeSpec) options() (*server.Options, error) {
	auth := &server.Options{}
	if !n.Open {
		if err := auth.ProcessConfigString(authConfig(n.Prefix, n.Creds)); err != nil {
			return nil, fmt.Errorf("devcluster: accounts: %w", err)
		}
	}
	name := nodeName(n.Index)
	return &server.Options{
		Accounts:           auth.Accounts,
		Users:              auth.Users,
		Nkeys:              auth.Nkeys,
		NoAuthUser:         auth.NoAuthUser,
		SystemAccount:      auth.SystemAccount,
		ServerName:         name,
		Host:               "127.0.0.1",
		Port:               portOrRandom(n.ClientPort),
		JetStream:          true,
		StoreDir:           filepath.Join(n.Dir, name),
		SyncAlways:         true,
		JetStreamUniqueTag: "az:",
		Tags:               []string{Zones[n.Index]},
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  8 << 30,
		Cluster: server.ClusterOpts{
			Name:        ClusterName,
			Host:        "127.0.0.1",
			Port:        portOrRandom(n.RoutePort),
			NoAdvertise: true,
		},
		Routes:              server.RoutesFromStr(strings.Join(n.Routes, ",")),
		NoSigs:              true,
		ProfPort:            n.ProfPort,
		LameDuckDuration:    LameDuckDuration,
		LameDuckGracePeriod: LameDuckGracePeriod,
	}, nil
}
