package upstream

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// RegisterNode creates the Node object name with spec.podCIDR (when valid)
// and, through the status subresource (the only way status is written),
// an InternalIP address ip and a Ready condition: kube-proxy reads its node
// IP from there. There is no kubelet in a run, so the harness plays its
// part.
func RegisterNode(ctx context.Context, cs kubernetes.Interface, name string, ip netip.Addr, podCIDR netip.Prefix) (*corev1.Node, error) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if podCIDR.IsValid() {
		n.Spec.PodCIDR = podCIDR.String()
		n.Spec.PodCIDRs = []string{podCIDR.String()}
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("could not create node %s: %w", name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: ip.String()},
		{Type: corev1.NodeHostName, Address: name},
	}
	now := metav1.Now()
	created.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KpsimHarness",
		Message: "registered by the kpsim harness (no kubelet)", LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	updated, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("could not set node %s's status: %w", name, err)
	}
	return updated, nil
}
