package nftables

import (
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpsim/kpsim/sim/cluster"
)

// The renderer describes what one service port needs as a record (its
// chains with their rules, its sets and maps, and its elements in the shared
// maps), keeps the records the kernel took, and emits the difference between
// the old and the new record of each changed service port.

// rule is one rule as written: text and optional comment.
type rule struct {
	text    string
	comment string
}

// chainRec is a chain and its rules, in order. Base chains also carry their
// type, hook and priority.
type chainRec struct {
	name    string
	comment string
	rules   []rule
	base    *baseChain
}

// baseChain is the hook of a base chain.
type baseChain struct {
	typ      knftables.BaseChainType
	hook     knftables.BaseChainHook
	priority knftables.BaseChainPriority
}

func (c *chainRec) object() *knftables.Chain {
	ch := &knftables.Chain{Name: c.name}
	if c.comment != "" {
		ch.Comment = knftables.PtrTo(c.comment)
	}
	if c.base != nil {
		ch.Type = knftables.PtrTo(c.base.typ)
		ch.Hook = knftables.PtrTo(c.base.hook)
		ch.Priority = knftables.PtrTo(c.base.priority)
	}
	return ch
}

func (c *chainRec) addRule(text, comment string) {
	c.rules = append(c.rules, rule{text: text, comment: comment})
}

func (c *chainRec) sameRules(o *chainRec) bool {
	return slices.Equal(c.rules, o.rules)
}

// elem is one set or map element.
type elem struct {
	key     []string
	value   []string // nil in sets
	comment string
}

func (e elem) keyString() string { return strings.Join(e.key, " . ") }

func (e elem) equal(o elem) bool {
	return slices.Equal(e.key, o.key) && slices.Equal(e.value, o.value) && e.comment == o.comment
}

func (e elem) object(container string, isMap bool) *knftables.Element {
	el := &knftables.Element{Key: e.key, Value: e.value}
	if isMap {
		el.Map = container
	} else {
		el.Set = container
	}
	if e.comment != "" {
		el.Comment = knftables.PtrTo(e.comment)
	}
	return el
}

// objDef is a set or map definition.
type objDef struct {
	name    string
	isMap   bool
	typ     string // Type, or "" when typeOf is set
	typeOf  string
	flags   []knftables.SetFlag
	timeout time.Duration
	comment string
}

// sameDef reports whether two definitions are the same object (elements
// aside): a definition that changes needs a delete and a re-add.
func (d *objDef) sameDef(o *objDef) bool {
	return d.name == o.name && d.isMap == o.isMap && d.typ == o.typ && d.typeOf == o.typeOf &&
		slices.Equal(d.flags, o.flags) && d.timeout == o.timeout && d.comment == o.comment
}

func (d *objDef) object() knftables.Object {
	var timeout *time.Duration
	if d.timeout > 0 {
		timeout = knftables.PtrTo(d.timeout)
	}
	var comment *string
	if d.comment != "" {
		comment = knftables.PtrTo(d.comment)
	}
	if d.isMap {
		return &knftables.Map{Name: d.name, Type: d.typ, TypeOf: d.typeOf, Flags: d.flags, Timeout: timeout, Comment: comment}
	}
	return &knftables.Set{Name: d.name, Type: d.typ, TypeOf: d.typeOf, Flags: d.flags, Timeout: timeout, Comment: comment}
}

// nameOnly is the object for a flush or delete.
func (d *objDef) nameOnly() knftables.Object {
	if d.isMap {
		return &knftables.Map{Name: d.name}
	}
	return &knftables.Set{Name: d.name}
}

// sharedElem is an element a service port owns in one of the shared maps or
// sets (service-ips, cluster-ips, ...). Several service ports may own the
// same key (cluster-ips of a multi-port Service, hairpin-endpoints of an
// endpoint behind two Services); the element stays while one owner is left.
type sharedElem struct {
	container string
	isMap     bool
	elem
}

// elemKey identifies a shared element.
type elemKey struct {
	container string
	key       string
}

func (s sharedElem) id() elemKey { return elemKey{s.container, s.keyString()} }

// svcRecord is everything one service port contributes to the table.
type svcRecord struct {
	spn    cluster.ServicePortName
	chains []*chainRec
	objs   []*objDef
	shared []sharedElem
	// sharedChains are the fast layout's selection chains the service
	// port uses (shared with other service ports, by name).
	sharedChains []*chainRec
	// noLocalInternal and noLocalExternal report Local policies without a
	// local endpoint (kube-proxy's sync_proxy_rules_no_local_endpoints_total).
	noLocalInternal, noLocalExternal bool
}

func (r *svcRecord) addShared(container string, isMap bool, key, value []string, comment string) {
	r.shared = append(r.shared, sharedElem{container: container, isMap: isMap, elem: elem{key: key, value: value, comment: comment}})
}

func (r *svcRecord) chain(name string) *chainRec {
	if r == nil {
		return nil
	}
	for _, c := range r.chains {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (r *svcRecord) obj(name string) *objDef {
	if r == nil {
		return nil
	}
	for _, o := range r.objs {
		if o.name == name {
			return o
		}
	}
	return nil
}

// ensureChain returns the record's chain of that name, appending it first
// when missing.
func (r *svcRecord) ensureChain(name string) *chainRec {
	if c := r.chain(name); c != nil {
		return c
	}
	c := &chainRec{name: name}
	r.chains = append(r.chains, c)
	return c
}
