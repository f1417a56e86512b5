// Package apiserver is the scenario's Kubernetes API without a cluster: the
// expanded scenario's objects live in client-go's fake clientset, shared
// informers watch them and feed sim/cluster's change trackers, and the events
// timeline is written through the clientset, so that every change arrives as
// an informer update, as it would from a real API server. It also holds the
// run summary `sim run` prints before it simulates.
package apiserver
