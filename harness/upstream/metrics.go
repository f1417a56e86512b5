package upstream

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics are the sync figures of one /metrics scrape of kube-proxy. Only
// the IPv4 family is read where a metric is labelled by ip_family; a
// metric kube-proxy does not (yet) export reads as zero.
type Metrics struct {
	// Syncs and SyncSeconds are kubeproxy_sync_proxy_rules_duration_seconds'
	// count and sum: every sync, failed ones included (observed when the
	// sync ends).
	Syncs       uint64
	SyncSeconds float64
	// Full and partial syncs (kubeproxy_sync_full_/partial_proxy_rules_duration_seconds).
	FullSyncs          uint64
	FullSyncSeconds    float64
	PartialSyncs       uint64
	PartialSyncSeconds float64
	// LastSync is kubeproxy_sync_proxy_rules_last_timestamp_seconds: when
	// the last successful sync ended (set just before its duration is
	// observed). Zero before the first.
	LastSync time.Time
	// LastQueued is kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds:
	// when a change last asked for a sync.
	LastQueued time.Time
	// Programming and ProgrammingSeconds are
	// kubeproxy_network_programming_duration_seconds' count and sum
	// (observed only for objects carrying a trigger time annotation).
	Programming        uint64
	ProgrammingSeconds float64
	// SyncErrors is kubeproxy_sync_proxy_rules_iptables_restore_failures_total
	// plus kubeproxy_sync_proxy_rules_nftables_sync_failures_total: syncs
	// whose kernel update failed (a partial iptables-restore failure that a
	// full sync then repaired is not counted).
	SyncErrors uint64
}

// Metric names read by ParseMetrics.
const (
	mSync        = "kubeproxy_sync_proxy_rules_duration_seconds"
	mFull        = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	mPartial     = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	mLast        = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	mQueued      = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
	mProgramming = "kubeproxy_network_programming_duration_seconds"
	mIPTFail     = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
	mNFTFail     = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
)

// ParseMetrics reads the sync figures from kube-proxy's /metrics text.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("could not parse kube-proxy's metrics: %w", err)
	}
	var m Metrics
	m.Syncs, m.SyncSeconds = histogram(fams[mSync])
	m.FullSyncs, m.FullSyncSeconds = histogram(fams[mFull])
	m.PartialSyncs, m.PartialSyncSeconds = histogram(fams[mPartial])
	m.Programming, m.ProgrammingSeconds = histogram(fams[mProgramming])
	m.LastSync = unixTime(gauge(fams[mLast]))
	m.LastQueued = unixTime(gauge(fams[mQueued]))
	m.SyncErrors = uint64(counter(fams[mIPTFail]) + counter(fams[mNFTFail]))
	return m, nil
}

// ipv4 picks the IPv4 series of a family: the one labelled
// ip_family="IPv4", or the unlabelled one.
func ipv4(f *dto.MetricFamily) *dto.Metric {
	if f == nil {
		return nil
	}
	for _, m := range f.GetMetric() {
		family, labelled := "", false
		for _, l := range m.GetLabel() {
			if l.GetName() == "ip_family" {
				family, labelled = l.GetValue(), true
			}
		}
		if !labelled || family == "IPv4" {
			return m
		}
	}
	return nil
}

func histogram(f *dto.MetricFamily) (uint64, float64) {
	h := ipv4(f).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

func gauge(f *dto.MetricFamily) float64 { return ipv4(f).GetGauge().GetValue() }

func counter(f *dto.MetricFamily) float64 { return ipv4(f).GetCounter().GetValue() }

// unixTime turns a Unix timestamp in seconds into a time; 0 is the zero
// time.
func unixTime(s float64) time.Time {
	if s <= 0 {
		return time.Time{}
	}
	sec, frac := math.Modf(s)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// Scrape reads kube-proxy's /metrics, dialling inside its namespace.
func (k *KubeProxy) Scrape(ctx context.Context) (Metrics, error) {
	body, err := k.ScrapeText(ctx)
	if err != nil {
		return Metrics{}, err
	}
	m, err := ParseMetrics(bytes.NewReader(body))
	if err == nil {
		k.history.record(m)
	}
	return m, err
}

// ScrapeText returns kube-proxy's /metrics text as served.
func (k *KubeProxy) ScrapeText(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.metricsURL, nil)
	if err != nil {
		return nil, fmt.Errorf("could not scrape kube-proxy: %w", err)
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("could not scrape kube-proxy on %s: %w", k.cfg.Node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("could not scrape kube-proxy on %s: %s", k.cfg.Node, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("could not scrape kube-proxy on %s: %w", k.cfg.Node, err)
	}
	return body, nil
}
