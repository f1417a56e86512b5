package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Doer makes one HTTP request to an agent: method, path (PathInfo, ...),
// query and body (nil for none; JSON otherwise). It returns the answer's
// body for a 2xx status and an error otherwise, an *HTTPError when the
// agent (or what stands between) answered.
type Doer func(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error)

// HTTPError is an answer with a status outside 2xx: Message is the agent's
// error text (or the body's), Where says which agent.
type HTTPError struct {
	Where   string
	Method  string
	Path    string
	Status  int
	Message string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("%s: %s %s: %d %s: %s", e.Where, e.Method, e.Path, e.Status, http.StatusText(e.Status), e.Message)
}

// IsBadRequest reports whether err is an agent's refusal of a request
// (HTTP 400): a client bug, not a network problem.
func IsBadRequest(err error) bool {
	var he *HTTPError
	return errors.As(err, &he) && he.Status == http.StatusBadRequest
}

// errorMessage is the text of an error body: the agent's {"error": ...},
// the API server's Status message, or the body itself.
func errorMessage(body []byte) string {
	var m struct {
		Error   string `json:"error"`
		Kind    string `json:"kind"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &m) == nil {
		switch {
		case m.Error != "":
			return m.Error
		case m.Kind == "Status" && m.Message != "":
			return m.Message
		}
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 512 {
		s = s[:512] + "..."
	}
	if s == "" {
		return "(no body)"
	}
	return s
}

// DirectDoer reaches an agent at baseURL ("http://10.244.1.5:9376") with
// client (http.DefaultClient when nil): for tests, and for a harness that
// can route to pod addresses.
func DirectDoer(baseURL string, client *http.Client) Doer {
	if client == nil {
		client = http.DefaultClient
	}
	base := strings.TrimSuffix(baseURL, "/")
	return func(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
		u := base + path
		if len(query) > 0 {
			u += "?" + query.Encode()
		}
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, u, rd)
		if err != nil {
			return nil, fmt.Errorf("agent %s: %w", base, err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("agent %s: %w", base, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		if err != nil {
			return nil, fmt.Errorf("agent %s: %s %s: could not read the answer: %w", base, method, path, err)
		}
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			return nil, &HTTPError{Where: "agent " + base, Method: method, Path: path, Status: resp.StatusCode, Message: errorMessage(b)}
		}
		return b, nil
	}
}

// Client drives one agent through Do.
type Client struct {
	Do Doer
}

func (c Client) getJSON(ctx context.Context, method, path string, query url.Values, body []byte, out any) error {
	b, err := c.Do(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: the agent's answer is not what the protocol says: %w", method, path, err)
	}
	return nil
}

// Info describes the agent (GET /v1/info).
func (c Client) Info(ctx context.Context) (Info, error) {
	var i Info
	err := c.getJSON(ctx, http.MethodGet, PathInfo, nil, nil, &i)
	return i, err
}

// Send asks a probe agent to send a block (POST /v1/send) and returns when
// it is done. A block that stopped early returns what was sent and an
// error saying why.
func (c Client) Send(ctx context.Context, req SendRequest) (SendResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return SendResult{}, err
	}
	var res SendResult
	if err := c.getJSON(ctx, http.MethodPost, PathSend, nil, body, &res); err != nil {
		return res, err
	}
	if res.Error != "" {
		return res, fmt.Errorf("the agent sent %d of %d probes of tag %d: %s", res.Sent, req.N, req.Tag, res.Error)
	}
	return res, nil
}

// Counts is what the agent observed of tag's probes (GET /v1/counts).
func (c Client) Counts(ctx context.Context, tag uint32) (Counts, error) {
	var out Counts
	err := c.getJSON(ctx, http.MethodGet, PathCounts, url.Values{"tag": {strconv.FormatUint(uint64(tag), 10)}}, nil, &out)
	return out, err
}

// Forget drops the agent's counts of the tags below below (POST
// /v1/forget).
func (c Client) Forget(ctx context.Context, below uint32) error {
	return c.getJSON(ctx, http.MethodPost, PathForget, url.Values{"below": {strconv.FormatUint(uint64(below), 10)}}, nil, nil)
}
