//go:build tools

// Package adapter only pins prometheus-adapter, the custom.metrics.k8s.io server the cluster
// test stage puts behind the chart's HPA path (see ../build-adapter.sh).
package adapter

import (
	_ "sigs.k8s.io/prometheus-adapter/cmd/adapter"
)
