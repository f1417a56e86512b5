package scenario

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// serverPrinted reports whether an object carries what only an API server
// sets (metadata.uid or metadata.resourceVersion): it was read from a real
// cluster, not written by hand.
func serverPrinted(n *yaml.Node) bool {
	md, _ := scalarField(n, "metadata")
	if md == nil || md.Kind != yaml.MappingNode {
		return false
	}
	for _, k := range []string{"uid", "resourceVersion"} {
		if v, ok := scalarField(md, k); ok && v.Value != "" {
			return true
		}
	}
	return false
}

// Loaded is a scenario read from a file, with the positions of its fields so
// that later stages (validation, expansion) can point at the line at fault.
type Loaded struct {
	File     string
	Scenario *Scenario
	// Warnings are what was accepted but not modelled, or inferred, each
	// positioned like an error (an IPv6 or FQDN EndpointSlice ignored, the
	// IPv6 half of a dual-stack Service, the cluster ranges inferred for a
	// kubectl dump). They are never fatal; commands print them on stderr.
	Warnings   ErrorList
	pos        map[string]Pos
	structural ErrorList
}

// underAny reports whether path is at or below the field of one of errs.
func underAny(path string, errs ErrorList) bool {
	for _, e := range errs {
		if e.Field == "" {
			continue
		}
		if path == e.Field || strings.HasPrefix(path, e.Field+".") || strings.HasPrefix(path, e.Field+"[") ||
			strings.HasPrefix(e.Field, path+".") || strings.HasPrefix(e.Field, path+"[") {
			return true
		}
	}
	return false
}

// PosOf returns the position of a field path, or of its nearest ancestor.
func (l *Loaded) PosOf(path string) Pos {
	r := reporter{file: l.File, pos: l.pos}
	return r.lookup(path)
}

// LoadFile reads, decodes and validates one scenario file. A non-nil error is
// an ErrorList (bad input) or an I/O error.
func LoadFile(path string) (*Loaded, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// A scenario that cannot be read is bad input (exit 2), named by file.
		msg := "could not read the scenario file"
		if errors.Is(err, fs.ErrNotExist) {
			msg = "no such scenario file"
		} else if errors.Is(err, fs.ErrPermission) {
			msg = "permission denied reading the scenario file"
		}
		var pe *fs.PathError
		if errors.As(err, &pe) && pe.Err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) {
			msg += ": " + pe.Err.Error()
		}
		return nil, ErrorList{{File: path, Message: msg}}
	}
	return Load(path, data)
}

// Load decodes and validates a scenario held in memory; file names it in errors.
func Load(file string, data []byte) (*Loaded, error) {
	l, err := decode(file, data)
	if err != nil {
		return nil, err
	}
	// Structural errors (unknown fields, wrong kinds of value) and semantic
	// ones are reported together; a semantic error about a value that was
	// already reported as malformed is dropped as a consequence of the first.
	errs := l.structural
	for _, e := range validate(l) {
		if !underAny(e.Field, l.structural) {
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		errs.Sort()
		return nil, errs
	}
	return l, nil
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// decode parses the YAML tree, checks it against the Go types (unknown fields,
// wrong kinds of value, duplicate keys), and converts it to typed values.
func decode(file string, data []byte) (*Loaded, error) {
	w := &walker{rep: reporter{file: file, pos: map[string]Pos{}}}
	docs, starts, err := readDocuments(data)
	if err != nil {
		return nil, ErrorList{yamlSyntaxError(file, err)}
	}
	if len(docs) == 0 {
		w.rep.errs = append(w.rep.errs, &FieldError{File: file, Pos: Pos{1, 1}, Message: "empty file: expected a Scenario document"})
		return nil, w.rep.errs
	}
	if isDump(docs[0]) {
		return decodeDump(file, docs)
	}
	if len(docs) > 1 {
		w.rep.errs = append(w.rep.errs, &FieldError{File: file, Pos: starts[1], Message: "a scenario file holds one YAML document; found a second"})
	}
	root := docs[0]
	w.rep.pos[""] = Pos{root.Line, root.Column}
	var buf bytes.Buffer
	w.value(&buf, root, reflect.TypeOf(Scenario{}), "")
	sc := &Scenario{}
	if err := json.Unmarshal(buf.Bytes(), sc); err != nil {
		if len(w.rep.errs) > 0 {
			w.rep.errs.Sort()
			return nil, w.rep.errs
		}
		// The walker checks every value; reaching this is a bug in the walker,
		// still reported as bad input with the file named.
		return nil, ErrorList{{File: file, Pos: Pos{1, 1}, Message: fmt.Sprintf("could not decode scenario: %v", err)}}
	}
	sc.Objects = w.objects
	return &Loaded{File: file, Scenario: sc, pos: w.rep.pos, structural: w.rep.errs, Warnings: w.warns}, nil
}

// readDocuments parses every YAML document of data and returns their roots
// and where each document starts, skipping empty documents (a trailing
// "---").
func readDocuments(data []byte) ([]*yaml.Node, []Pos, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []*yaml.Node
	var starts []Pos
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return out, starts, nil
			}
			return nil, nil, err
		}
		start := Pos{doc.Line, doc.Column}
		root := &doc
		if root.Kind == yaml.DocumentNode {
			if len(root.Content) != 1 {
				continue
			}
			root = root.Content[0]
		}
		if root.Kind == yaml.ScalarNode && root.Tag == "!!null" && len(out) > 0 {
			continue
		}
		out = append(out, root)
		starts = append(starts, start)
	}
}

func yamlSyntaxError(file string, err error) *FieldError {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &FieldError{File: file, Pos: Pos{line, 1}, Message: "YAML syntax: " + m[2]}
	}
	return &FieldError{File: file, Pos: Pos{1, 1}, Message: "YAML syntax: " + strings.TrimPrefix(msg, "yaml: ")}
}

// walker checks a YAML tree against a Go type and writes the equivalent JSON.
type walker struct {
	rep     reporter
	objects []Object
	warns   ErrorList
	// lenient is set while walking an object an API server printed (it has
	// a uid or a resourceVersion): a field this build does not know is a
	// newer server's, reported as a warning and dropped, not an error.
	lenient bool
}

var (
	jsonUnmarshaler = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
	scenarioType    = reflect.TypeOf(Scenario{})
	rawExtType      = reflect.TypeOf(runtime.RawExtension{})
)

func (w *walker) errAt(n *yaml.Node, path, format string, args ...any) {
	w.rep.errs = append(w.rep.errs, &FieldError{File: w.rep.file, Pos: Pos{n.Line, n.Column}, Field: path, Message: fmt.Sprintf(format, args...)})
}

func (w *walker) warnAt(n *yaml.Node, path, format string, args ...any) {
	w.warns = append(w.warns, &FieldError{File: w.rep.file, Pos: Pos{n.Line, n.Column}, Field: path, Message: fmt.Sprintf(format, args...)})
}

func (w *walker) value(buf *bytes.Buffer, n *yaml.Node, t reflect.Type, path string) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	w.rep.pos[path] = Pos{n.Line, n.Column}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		buf.WriteString("null")
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawExtType || t.Kind() == reflect.Interface {
		w.anyValue(buf, n, path)
		return
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		w.customScalar(buf, n, t, path)
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		w.structValue(buf, n, t, path)
	case reflect.Map:
		w.mapValue(buf, n, t, path)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // []byte is base64 text in JSON
			w.scalar(buf, n, reflect.TypeOf(""), path)
			return
		}
		if n.Kind != yaml.SequenceNode {
			w.errAt(n, path, "expected a list, got %s", describe(n))
			buf.WriteString("null")
			return
		}
		buf.WriteByte('[')
		for i, item := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			w.value(buf, item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
		buf.WriteByte(']')
	default:
		w.scalar(buf, n, t, path)
	}
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "something else"
}

func (w *walker) scalar(buf *bytes.Buffer, n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.ScalarNode {
		w.errAt(n, path, "expected %s, got %s", kindName(t), describe(n))
		buf.WriteString("null")
		return
	}
	switch t.Kind() {
	case reflect.String:
		b, _ := json.Marshal(n.Value)
		buf.Write(b)
		return
	case reflect.Bool:
		if n.Tag == "!!bool" {
			var v bool
			if n.Decode(&v) == nil {
				buf.WriteString(strconv.FormatBool(v))
				return
			}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n.Tag == "!!int" {
			var v int64
			if n.Decode(&v) == nil {
				lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
				if bits := t.Bits(); bits < 64 {
					lo, hi = -(1 << (bits - 1)), 1<<(bits-1)-1
				}
				if v < lo || v > hi {
					w.errAt(n, path, "%d is out of range for a %d-bit integer", v, t.Bits())
					buf.WriteString("0")
					return
				}
				buf.WriteString(strconv.FormatInt(v, 10))
				return
			}
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Tag == "!!int" {
			var v uint64
			if n.Decode(&v) == nil {
				if t.Bits() < 64 && v >= 1<<t.Bits() {
					w.errAt(n, path, "%d is out of range for a %d-bit unsigned integer", v, t.Bits())
					buf.WriteString("0")
					return
				}
				buf.WriteString(strconv.FormatUint(v, 10))
				return
			}
			w.errAt(n, path, "expected a non-negative integer, got %s", describe(n))
			buf.WriteString("0")
			return
		}
	case reflect.Float32, reflect.Float64:
		if n.Tag == "!!int" || n.Tag == "!!float" {
			var v float64
			if n.Decode(&v) == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
				buf.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
				return
			}
		}
	}
	w.errAt(n, path, "expected %s, got %s", kindName(t), describe(n))
	buf.WriteString("null")
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Struct:
		return "a mapping"
	case reflect.Map:
		return "a mapping"
	case reflect.Slice:
		return "a list"
	}
	return t.String()
}

// customScalar handles the types that decode themselves from JSON
// (durations, times, quantities, int-or-string, raw fields).
func (w *walker) customScalar(buf *bytes.Buffer, n *yaml.Node, t reflect.Type, path string) {
	name := t.String()
	switch name {
	case "v1.FieldsV1":
		w.anyValue(buf, n, path)
		return
	}
	if n.Kind != yaml.ScalarNode {
		w.errAt(n, path, "expected a single value, got %s", describe(n))
		buf.WriteString("null")
		return
	}
	switch name {
	case "intstr.IntOrString":
		if n.Tag == "!!int" {
			var v int32
			if err := n.Decode(&v); err != nil {
				w.errAt(n, path, "expected a 32-bit integer or a name, got %s", describe(n))
				buf.WriteString("0")
				return
			}
			buf.WriteString(strconv.FormatInt(int64(v), 10))
			return
		}
	case "resource.Quantity":
		// a number or a string; both decode from a JSON string
	default:
		// durations and times are strings
	}
	// Validate by decoding into the real type so the error is reported here,
	// with the position, rather than later without one.
	b, _ := json.Marshal(n.Value)
	v := reflect.New(t).Interface().(json.Unmarshaler)
	if err := v.UnmarshalJSON(b); err != nil {
		what := "value"
		switch name {
		case "v1.Duration":
			what = "duration such as 500ms, 10s or 2m"
		case "v1.Time":
			what = "RFC 3339 time"
		case "resource.Quantity":
			what = "quantity"
		}
		w.errAt(n, path, "expected a %s, got %s", what, describe(n))
		buf.WriteString("null")
		return
	}
	buf.Write(b)
}

// anyValue converts an untyped subtree to JSON.
func (w *walker) anyValue(buf *bytes.Buffer, n *yaml.Node, path string) {
	var v any
	if err := n.Decode(&v); err != nil {
		w.errAt(n, path, "could not read value: %v", err)
		buf.WriteString("null")
		return
	}
	b, err := json.Marshal(normalize(v))
	if err != nil {
		w.errAt(n, path, "value cannot be expressed as JSON: %v", err)
		buf.WriteString("null")
		return
	}
	buf.Write(b)
}

func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[fmt.Sprint(k)] = normalize(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
	}
	return v
}

type fieldInfo struct {
	name string
	typ  reflect.Type
}

// fieldCache maps a reflect.Type to its map[string]fieldInfo; scenarios
// load concurrently (sim run of several files, tests), hence a sync.Map.
var fieldCache sync.Map

// jsonFields lists a struct's JSON field names, following inline and
// embedded structs as encoding/json does.
func jsonFields(t reflect.Type) map[string]fieldInfo {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]fieldInfo)
	}
	out := map[string]fieldInfo{}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := sf.Type
		if (sf.Anonymous && name == "") || strings.Contains(","+opts+",", ",inline,") {
			et := ft
			for et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					if _, dup := out[k]; !dup {
						out[k] = v
					}
				}
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		out[name] = fieldInfo{name: name, typ: ft}
	}
	f, _ := fieldCache.LoadOrStore(t, out)
	return f.(map[string]fieldInfo)
}

func (w *walker) structValue(buf *bytes.Buffer, n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.MappingNode {
		w.errAt(n, path, "expected a mapping, got %s", describe(n))
		buf.WriteString("null")
		return
	}
	fields := jsonFields(t)
	seen := map[string]bool{}
	buf.WriteByte('{')
	first := true
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		fpath := joinPath(path, key)
		if k.Kind != yaml.ScalarNode {
			w.errAt(k, path, "mapping keys must be names, got %s", describe(k))
			continue
		}
		if key == "<<" {
			w.errAt(k, path, "YAML merge keys (<<) are not supported; write the fields out")
			continue
		}
		if seen[key] {
			w.errAt(k, fpath, "field appears twice in the same mapping")
			continue
		}
		seen[key] = true
		if t == scenarioType && key == "objects" {
			w.rep.pos[fpath] = Pos{v.Line, v.Column}
			w.objectList(v, fpath)
			continue
		}
		fi, ok := fields[key]
		if !ok {
			msg := fmt.Sprintf("unknown field %q", key)
			if s := suggest(key, fields); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			if w.lenient {
				w.warnAt(k, fpath, "%s: ignored (the object was printed by an API server newer than this build's %s)", msg, "k8s.io/api")
				continue
			}
			w.errAt(k, fpath, "%s", msg)
			continue
		}
		if !first {
			buf.WriteByte(',')
		}
		first = false
		kb, _ := json.Marshal(key)
		buf.Write(kb)
		buf.WriteByte(':')
		w.value(buf, v, fi.typ, fpath)
	}
	buf.WriteByte('}')
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (w *walker) mapValue(buf *bytes.Buffer, n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.MappingNode {
		w.errAt(n, path, "expected a mapping, got %s", describe(n))
		buf.WriteString("null")
		return
	}
	seen := map[string]bool{}
	buf.WriteByte('{')
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		fpath := joinPath(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			w.errAt(k, path, "mapping keys must be scalars, got %s", describe(k))
			continue
		}
		if seen[k.Value] {
			w.errAt(k, fpath, "key appears twice in the same mapping")
			continue
		}
		seen[k.Value] = true
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, _ := json.Marshal(k.Value)
		buf.Write(kb)
		buf.WriteByte(':')
		w.value(buf, v, t.Elem(), fpath)
	}
	buf.WriteByte('}')
}

// Kinds accepted in the objects section.
var objectKinds = map[string]map[string]reflect.Type{
	"v1": {
		"Node":    reflect.TypeOf(corev1.Node{}),
		"Pod":     reflect.TypeOf(corev1.Pod{}),
		"Service": reflect.TypeOf(corev1.Service{}),
	},
	"discovery.k8s.io/v1": {
		"EndpointSlice": reflect.TypeOf(discoveryv1.EndpointSlice{}),
	},
}

func (w *walker) objectList(n *yaml.Node, path string) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.SequenceNode {
		w.errAt(n, path, "expected a list of Kubernetes objects, got %s", describe(n))
		return
	}
	for i, item := range n.Content {
		w.object(item, fmt.Sprintf("%s[%d]", path, i))
	}
}

func scalarField(n *yaml.Node, key string) (*yaml.Node, bool) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			v := n.Content[i+1]
			return v, v.Kind == yaml.ScalarNode
		}
	}
	return nil, false
}

func (w *walker) object(n *yaml.Node, path string) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	w.rep.pos[path] = Pos{n.Line, n.Column}
	if n.Kind != yaml.MappingNode {
		w.errAt(n, path, "expected a Kubernetes object (a mapping with apiVersion and kind), got %s", describe(n))
		return
	}
	av, okAV := scalarField(n, "apiVersion")
	kd, okK := scalarField(n, "kind")
	if !okAV || !okK {
		w.errAt(n, path, "a Kubernetes object needs apiVersion and kind")
		return
	}
	if isList(n) {
		w.list(n, path)
		return
	}
	served := serverPrinted(n)
	kinds, ok := objectKinds[av.Value]
	if !ok {
		if served {
			w.warnAt(av, joinPath(path, "apiVersion"), "%s %s ignored: kube-proxy reads only v1 Node, Pod, Service and discovery.k8s.io/v1 EndpointSlice", av.Value, kd.Value)
			return
		}
		w.errAt(av, joinPath(path, "apiVersion"), "unsupported apiVersion %q: objects are v1 Node, Pod, Service, List and discovery.k8s.io/v1 EndpointSlice", av.Value)
		return
	}
	t, ok := kinds[kd.Value]
	if !ok {
		if served {
			w.warnAt(kd, joinPath(path, "kind"), "%s %s ignored: kube-proxy reads only v1 Node, Pod, Service and discovery.k8s.io/v1 EndpointSlice", av.Value, kd.Value)
			return
		}
		w.errAt(kd, joinPath(path, "kind"), "unsupported kind %q for apiVersion %s: objects are v1 Node, Pod, Service, List and discovery.k8s.io/v1 EndpointSlice", kd.Value, av.Value)
		return
	}
	w.lenient = served
	defer func() { w.lenient = false }()
	before := len(w.rep.errs)
	var buf bytes.Buffer
	w.value(&buf, n, t, path)
	if len(w.rep.errs) > before {
		return
	}
	obj := reflect.New(t).Interface().(runtime.Object)
	if err := json.Unmarshal(buf.Bytes(), obj); err != nil {
		w.errAt(n, path, "could not decode %s: %v", kd.Value, err)
		return
	}
	w.objects = append(w.objects, Object{Path: path, Object: obj})
}

func (w *walker) list(n *yaml.Node, path string) {
	var items *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "apiVersion", "kind", "metadata":
		case "items":
			items = v
		default:
			w.errAt(k, joinPath(path, k.Value), "unknown field %q in a List (expected apiVersion, kind, metadata, items)", k.Value)
		}
	}
	if items == nil || (items.Kind == yaml.ScalarNode && items.Tag == "!!null") {
		return
	}
	ipath := joinPath(path, "items")
	w.rep.pos[ipath] = Pos{items.Line, items.Column}
	if items.Kind != yaml.SequenceNode {
		w.errAt(items, ipath, "expected a list, got %s", describe(items))
		return
	}
	for i, item := range items.Content {
		w.object(item, fmt.Sprintf("%s[%d]", ipath, i))
	}
}

// suggest returns the known field closest to key, if it is close enough to be
// a typo.
func suggest(key string, fields map[string]fieldInfo) string {
	best, bestD := "", 3
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if d := editDistance(strings.ToLower(key), strings.ToLower(k)); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
