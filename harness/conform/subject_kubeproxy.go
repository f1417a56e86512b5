package conform

import (
	"errors"
	"net/netip"
)

// newKubeProxies is the kube-proxy subject (not yet built).
func (s *suite) newKubeProxies(netip.Prefix, string) (proxies, error) {
	return nil, errors.New("the kube-proxy subject is not built yet")
}
