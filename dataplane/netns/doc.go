// Package netns builds a run's network: named network namespaces for the
// nodes (where proxy rules live), a fabric bridge between them, one backend
// namespace per node holding every endpoint address of that node, and one
// namespace per client pod; and it removes them again, on Close, on SIGINT
// or SIGTERM (WithSignalCleanup), or after a killed run (Cleanup, `sim
// cleanup`).
//
// The host is never touched: nothing is created in the root network
// namespace (veth pairs are created inside one namespace with their peer
// placed directly in another), every namespace name starts with
// "kpsim-<runid>-" and every link carries that prefix in an alternative name.
//
// Namespace work runs on a locked OS thread (Do); a thread that failed to
// switch back is never unlocked. See README.md for the diagram, the naming
// scheme and how to inspect a live run.
package netns
