package agent

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

// PodProxyDoer reaches the agent in pod namespace/pod on port through the
// kube-apiserver's pods/proxy subresource:
//
//	POST /api/v1/namespaces/NS/pods/POD:PORT/proxy/v1/send
//
// c is a core/v1 REST client (clientset.CoreV1().RESTClient()). The
// harness needs no route to pod addresses, only the API server and RBAC
// for create and get on pods/proxy. Errors name the pod; an answer outside
// 2xx is an *HTTPError carrying the agent's message (or the API server's:
// no such pod, pod not running, the agent unreachable).
func PodProxyDoer(c rest.Interface, namespace, pod string, port int) Doer {
	where := fmt.Sprintf("agent pod %s/%s port %d (through pods/proxy)", namespace, pod, port)
	return func(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
		req := c.Verb(method).Namespace(namespace).Resource("pods").Name(fmt.Sprintf("%s:%d", pod, port)).
			SubResource("proxy").Suffix(strings.TrimPrefix(path, "/"))
		for k, vs := range query {
			for _, v := range vs {
				req = req.Param(k, v)
			}
		}
		if body != nil {
			req = req.SetHeader("Content-Type", "application/json").Body(body)
		}
		b, err := req.DoRaw(ctx)
		if err == nil {
			return b, nil
		}
		var st apierrors.APIStatus
		if errors.As(err, &st) && st.Status().Code != 0 {
			msg := errorMessage(b)
			if len(b) == 0 {
				msg = st.Status().Message
			}
			return nil, &HTTPError{Where: where, Method: method, Path: path, Status: int(st.Status().Code), Message: msg}
		}
		return nil, fmt.Errorf("%s: %s %s: %w", where, method, path, err)
	}
}
