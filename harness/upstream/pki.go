package upstream

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Users of the static token file. kube-proxy's rights come from the
// built-in system:node-proxier ClusterRoleBinding, whose subject is the
// user system:kube-proxy.
const (
	AdminUser     = "kpsim-admin"
	AdminGroup    = "system:masters"
	KubeProxyUser = "system:kube-proxy"
)

// Files of the control plane in its Dir.
const (
	caCertFile    = "ca.crt"
	serveCertFile = "apiserver.crt"
	serveKeyFile  = "apiserver.key"
	saKeyFile     = "sa.key"
	saPubFile     = "sa.pub"
	tokenFile     = "tokens.csv"
	adminKubeconf = "admin.kubeconfig"
)

// credentials are a run's generated secrets: the CA (PEM) and the two
// bearer tokens.
type credentials struct {
	caPEM      []byte
	adminToken string
	proxyToken string
	userTokens map[string]string // ControlPlaneConfig.Users by name
}

// writePKI generates, in dir, a CA, the apiserver's serving certificate
// (servingSANs), an RSA service-account key pair and the token file.
func writePKI(dir string, addr, serviceIP netip.Addr) (*credentials, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("could not generate the CA key: %w", err)
	}
	now := time.Now().Add(-time.Hour)
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kpsim-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("could not create the CA certificate: %w", err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("could not generate the serving key: %w", err)
	}
	ips, dns := servingSANs(addr, serviceIP)
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now,
		NotAfter:     now.Add(10 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("could not create the serving certificate: %w", err)
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, fmt.Errorf("could not encode the serving key: %w", err)
	}
	// Service-account tokens: kube-apiserver wants an RSA (or ECDSA) key
	// pair; RSA is what kubeadm uses.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("could not generate the service-account key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("could not encode the service-account key: %w", err)
	}
	c := &credentials{caPEM: pemBlock("CERTIFICATE", caDER)}
	if c.adminToken, err = newToken(); err != nil {
		return nil, err
	}
	if c.proxyToken, err = newToken(); err != nil {
		return nil, err
	}
	files := map[string][]byte{
		caCertFile:    c.caPEM,
		serveCertFile: pemBlock("CERTIFICATE", srvDER),
		serveKeyFile:  pemBlock("EC PRIVATE KEY", srvKeyDER),
		saKeyFile:     pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)),
		saPubFile:     pemBlock("PUBLIC KEY", saPub),
		tokenFile:     []byte(tokenCSV(c.adminToken, c.proxyToken)),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("could not write %s: %w", name, err)
		}
	}
	return c, nil
}

// servingSANs are the apiserver certificate's subject alternative names:
// its fabric address, the first service IP (the default/kubernetes
// ClusterIP), 127.0.0.1, and the in-cluster DNS names plus localhost.
func servingSANs(addr, serviceIP netip.Addr) ([]net.IP, []string) {
	ips := []net.IP{net.IP(addr.AsSlice()), net.IP(serviceIP.AsSlice()), net.IPv4(127, 0, 0, 1).To4()}
	dns := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}
	return ips, dns
}

// firstServiceIP is the ClusterIP the apiserver gives default/kubernetes:
// the service range's first address after the network address.
func firstServiceIP(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func newToken() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("could not draw a token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// tokenCSV is kube-apiserver's --token-auth-file: token,user,uid,"groups".
// The admin is in system:masters; system:kube-proxy needs no group.
func tokenCSV(adminToken, proxyToken string) string {
	return fmt.Sprintf("%s,%s,%s,\"%s\"\n%s,%s,%s\n",
		adminToken, AdminUser, AdminUser, AdminGroup,
		proxyToken, KubeProxyUser, KubeProxyUser)
}

// appendUsers draws a token for each user and appends their lines to the
// token file in dir.
func appendUsers(dir string, users []User) (map[string]string, error) {
	tokens := map[string]string{}
	if len(users) == 0 {
		return tokens, nil
	}
	var b strings.Builder
	for _, u := range users {
		if u.Name == "" || strings.ContainsAny(u.Name, ",\"\n") {
			return nil, fmt.Errorf("could not add user %q to the token file: not a plain name", u.Name)
		}
		if _, dup := tokens[u.Name]; dup {
			return nil, fmt.Errorf("could not add user %q to the token file: listed twice", u.Name)
		}
		t, err := newToken()
		if err != nil {
			return nil, err
		}
		tokens[u.Name] = t
		fmt.Fprintf(&b, "%s,%s,%s", t, u.Name, u.Name)
		if len(u.Groups) > 0 {
			fmt.Fprintf(&b, ",\"%s\"", strings.Join(u.Groups, ","))
		}
		b.WriteString("\n")
	}
	f, err := os.OpenFile(filepath.Join(dir, tokenFile), os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("could not add users to the token file: %w", err)
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("could not add users to the token file: %w", err)
	}
	return tokens, nil
}

// kubeconfig is a kubeconfig for one user with a bearer token, trusting
// caPEM for server.
func kubeconfig(server string, caPEM []byte, user, token string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Config\n")
	fmt.Fprintf(&b, "clusters:\n- name: kpsim\n  cluster:\n    server: %s\n    certificate-authority-data: %s\n",
		server, base64.StdEncoding.EncodeToString(caPEM))
	fmt.Fprintf(&b, "users:\n- name: %s\n  user:\n    token: %s\n", user, token)
	fmt.Fprintf(&b, "contexts:\n- name: kpsim\n  context:\n    cluster: kpsim\n    user: %s\n", user)
	fmt.Fprintf(&b, "current-context: kpsim\n")
	return b.String()
}
