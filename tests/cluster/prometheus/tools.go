//go:build tools

// Package prometheus only pins the Prometheus server and promtool the cluster test stage builds
// (see ../build-prometheus.sh): Debian's prometheus package is built without Kubernetes service
// discovery, which the stage needs to find worker pods the way a cluster's Prometheus does.
package prometheus

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
