// Package deploytest holds the tests of deploy/, which has no Go code: every
// nats-server configuration parsed by nats-server's own parser, the compose
// and Kubernetes files and the Grafana dashboard checked against the NATS
// configurations and lockd, and the account setup started for real (three
// servers from deploy/'s files, TLS on, the service as its two users) to
// show what each kind of user can and cannot do.
package deploytest
