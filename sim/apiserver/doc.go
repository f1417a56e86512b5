// Package apiserver is the scenario's Kubernetes API: shared informers watch
// Services, EndpointSlices and Nodes and feed sim/cluster's change trackers,
// and the events timeline is written through the same client, so that every
// change arrives as an informer update.
//
// The API is either client-go's fake clientset (Load, New, Open: the
// expanded scenario's objects held by it, no cluster needed) or any other
// clientset, a real kube-apiserver's included (Connect). One writer serves
// both: Seed writes an expanded scenario (namespaces, Nodes with their
// status, Services, EndpointSlices; never Pods), Upsert and DeleteObjects
// write objects a harness generates itself, Delete removes what Seed wrote,
// and Cluster.Apply (the Writer interface) writes a timeline step. Every
// write starts from the API's current object and is retried on a conflict,
// and every EndpointSlice write carries
// endpoints.kubernetes.io/last-change-trigger-time, as the EndpointSlice
// controller's do (kube-proxy measures network programming latency from it).
//
// Our own dataplane runs against a real API server the way it runs in
// harness/conform over the fake one: Connect(client), Start,
// AddTrackerSynced, then dataplane.NewSyncer over that tracker.
//
// It also holds the run summary `sim run` prints before it simulates.
package apiserver
