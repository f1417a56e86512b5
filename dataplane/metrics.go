package dataplane

import (
	"bytes"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// Metrics are a proxy's sync metrics under kube-proxy's names (subsystem
// kubeproxy, pkg/proxy/metrics), in a registry of their own per proxy: one
// run programs several nodes, each with its own proxy.
type Metrics struct {
	Registry *prometheus.Registry

	SyncDuration           prometheus.Histogram
	SyncFullDuration       prometheus.Histogram
	SyncPartialDuration    prometheus.Histogram
	LastSyncTimestamp      prometheus.Gauge
	NetworkProgramming     prometheus.Histogram
	RestoreFailures        prometheus.Counter
	PartialRestoreFailures prometheus.Counter
	NoLocalEndpoints       *prometheus.GaugeVec
	EndpointChangesTotal   prometheus.Counter
	ServiceChangesTotal    prometheus.Counter
	RulesLast              *prometheus.GaugeVec
	// ConntrackReconcile and ConntrackDeleted time the stale UDP
	// conntrack cleanup after a sync and count the entries it deleted.
	ConntrackReconcile prometheus.Histogram
	ConntrackDeleted   prometheus.Counter
}

// networkProgrammingBuckets are kube-proxy's: 0.25 s steps to 1 s, 1 s steps
// to a minute, then coarser to 5 minutes.
func networkProgrammingBuckets() []float64 {
	var b []float64
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	b = append(b, prometheus.LinearBuckets(120, 30, 7)...)
	return b
}

// NewMetrics creates the metrics in a fresh registry. labels are constant
// labels added to every metric (for example the node).
func NewMetrics(labels prometheus.Labels) *Metrics {
	syncBuckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	h := func(name, help string, b []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Subsystem: "kubeproxy", Name: name, Help: help, Buckets: b, ConstLabels: labels})
	}
	m := &Metrics{
		Registry:            prometheus.NewRegistry(),
		SyncDuration:        h("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", syncBuckets),
		SyncFullDuration:    h("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", syncBuckets),
		SyncPartialDuration: h("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", syncBuckets),
		LastSyncTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: "kubeproxy", Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced", ConstLabels: labels}),
		NetworkProgramming: h("network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", networkProgrammingBuckets()),
		RestoreFailures: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: "sync_proxy_rules_iptables_restore_failures_total",
			Help: "Cumulative proxy iptables restore failures", ConstLabels: labels}),
		PartialRestoreFailures: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
			Help: "Cumulative proxy iptables partial restore failures", ConstLabels: labels}),
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "kubeproxy", Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints", ConstLabels: labels}, []string{"traffic_policy"}),
		EndpointChangesTotal: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes", ConstLabels: labels}),
		ServiceChangesTotal: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes", ConstLabels: labels}),
		RulesLast: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "kubeproxy", Name: "sync_proxy_rules_iptables_last",
			Help: "Number of proxy iptables rules programmed in the last sync", ConstLabels: labels}, []string{"table"}),
		ConntrackReconcile: h("conntrack_reconciler_sync_duration_seconds", "ReconcileConntrackFlowsLatency latency in seconds", syncBuckets),
		ConntrackDeleted: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: "conntrack_reconciler_deleted_entries_total",
			Help: "Cumulative conntrack flows deleted by conntrack reconciler", ConstLabels: labels}),
	}
	m.Registry.MustRegister(m.SyncDuration, m.SyncFullDuration, m.SyncPartialDuration, m.LastSyncTimestamp,
		m.NetworkProgramming, m.RestoreFailures, m.PartialRestoreFailures, m.NoLocalEndpoints,
		m.EndpointChangesTotal, m.ServiceChangesTotal, m.RulesLast, m.ConntrackReconcile, m.ConntrackDeleted)
	return m
}

// WriteText writes every metric in the Prometheus text format.
func (m *Metrics) WriteText(w io.Writer) error {
	families, err := m.Registry.Gather()
	if err != nil {
		return fmt.Errorf("could not gather metrics: %w", err)
	}
	var buf bytes.Buffer
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&buf, f); err != nil {
			return fmt.Errorf("could not format metric %s: %w", f.GetName(), err)
		}
	}
	_, err = w.Write(buf.Bytes())
	return err
}
