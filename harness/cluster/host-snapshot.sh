#!/bin/sh
# host-snapshot.sh FILE: what a local cluster run must leave as it found it,
# written to FILE, for `diff` before and after (root): the host's sysctls
# (sysctl -a, minus counters that move by themselves), every cgroup folder,
# the root namespace's named network namespaces, links and rulesets, the
# host's mount points, the folders containerd, the kubelet and CNI would
# write by default, and the processes of the programs a node runs.
set -u
out=$1
{
  echo "## sysctl -a (volatile counters left out)"
  sysctl -a 2>/dev/null | grep -v -E '^(kernel\.random\.|fs\.dentry-state|fs\.file-nr|fs\.inode-|kernel\.ns_last_pid|net\.netfilter\.nf_conntrack_count|kernel\.pty\.nr|fs\.aio-nr|fs\.quota\.|kernel\.sched_domain|net\.ipv4\.route\.gc_|kernel\.tainted|fs\.fanotify\.|vm\.stat_refresh|fs\.pipe-user-pages|fs\.mqueue\.|user\.)'
  echo "## kernel parameters under /sys (module parameters, mm)"
  grep -r . /sys/module/*/parameters/ /sys/kernel/mm/transparent_hugepage/ 2>/dev/null | grep -v -E '/stats/|page_reporting/parameters/(passes|walked|reported_kib)'
  echo "## cgroup folders"
  find /sys/fs/cgroup -mindepth 1 -type d | sort
  echo "## ip netns"
  ip netns list 2>/dev/null
  echo "## root links"
  ip -o link show | sed 's/^[0-9]*: //' | cut -d' ' -f1 | sort
  echo "## iptables-save"
  iptables-save 2>/dev/null | grep -v '^#'
  echo "## nft list ruleset"
  nft list ruleset 2>/dev/null
  echo "## host mount points"
  awk '{print $5, $9}' /proc/self/mountinfo | sort
  echo "## default folders of containerd, the kubelet and CNI (none should exist)"
  for d in /var/lib/kubelet /var/lib/containerd /var/lib/cni /etc/cni /opt/cni /opt/containerd /etc/containerd /etc/kubernetes \
           /usr/libexec/kubernetes /var/log/pods /var/log/containers /run/containerd /run/netns/cni /var/run/netns /run/kubernetes /var/run/kubernetes /run/nri; do
    [ -e "$d" ] && echo "exists: $d"
  done
  ls /run/netns 2>/dev/null | grep -v '^kpsim-' | sed 's/^/netns: /'
  echo "## processes of node programs"
  ps -eo comm= | grep -E '^(containerd|containerd-shim|ctr|runc|kubelet|kube-controller|kube-scheduler|kube-apiserver|etcd|pause|ptp|host-local|loopback)' | sort | uniq -c
} > "$out"
