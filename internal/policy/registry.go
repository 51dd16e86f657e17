package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/suggest"
)

// Params are a policy's parameters as text (from YAML config or "name:key=value,..." flags).
// A policy reads them with the typed getters and then calls Check, so that an unknown key or a
// malformed value is an error naming it, never a quiet default.
type Params map[string]string

// Factory builds a policy.
type Factory func(env Env, p Params) (Picker, error)

// Builtin returns the registered policies by name. It builds a fresh map on every call: there is
// no package-level registry to mutate.
func Builtin() map[string]Factory {
	return map[string]Factory{
		"round-robin":     newRoundRobin,
		"random":          newRandom,
		"least-request":   newLeastRequest,
		"power-of-two":    newPowerOfTwo,
		"prefix-aware":    newPrefixAware,
		"consistent-hash": newConsistentHash,
		"prefix-spill":    newPrefixSpill,
		"cache-aware":     newCacheAware,
		"scorer-weighted": newScorerWeighted,
		"overlap-cost":    newOverlapCost,
	}
}

// Names returns the registered policy names, sorted.
func Names() []string {
	m := Builtin()
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// New builds the named policy. An unknown name is an error listing the valid ones.
func New(name string, p Params, env Env) (Picker, error) {
	f, ok := Builtin()[name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (valid: %s)", name, strings.Join(Names(), ", "))
	}
	if env.Clock == nil {
		env.Clock = WallClock{}
	}
	pk, err := f(env, p)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	return pk, nil
}

// Defaults returns the parameters the named policy takes, each with the default it takes when
// the parameter is absent, as its getter reads it: an int, a float64, a time.Duration or a
// bool. They are read from the policy's constructor, built with no parameters, so they are the
// ones the policy uses. A policy without parameters has none (an empty map); an unknown name
// is an error listing the valid ones.
func Defaults(name string) (map[string]any, error) {
	defaults := map[string]any{}
	if _, err := New(name, nil, Env{defaults: defaults}); err != nil {
		return nil, err
	}
	return defaults, nil
}

// Check reports what New would say of the named policy with p: nil when it builds. It is what
// config validation asks of a policy (config.Checks.Policy), so that a bad parameter is named
// with every other problem of the config.
func Check(name string, p map[string]string) error {
	_, err := New(name, p, Env{})
	return err
}

// ParseSpec splits "name:key=value,key=value" into a name and its params.
func ParseSpec(spec string) (string, Params, error) {
	name, rest, _ := strings.Cut(spec, ":")
	name = strings.TrimSpace(name)
	if name == "" {
		return "", nil, fmt.Errorf("empty policy name in %q", spec)
	}
	p := Params{}
	if rest == "" {
		return name, p, nil
	}
	for kv := range strings.SplitSeq(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return "", nil, fmt.Errorf("policy %s: parameter %q is not key=value", name, kv)
		}
		p[k] = strings.TrimSpace(v)
	}
	return name, p, nil
}

// paramReader reads Params, remembering which keys were read and the first errors.
type paramReader struct {
	p    Params
	seen map[string]bool
	gone map[string]bool // the keys of removed parameters: read, but not known
	errs []string
	// defaults, when not nil, collects the default of each parameter read that was absent, as
	// the getter took it (int, float64, time.Duration, bool): Defaults.
	defaults map[string]any
}

// absent notes that key took its default def.
func (r *paramReader) absent(key string, def any) {
	if r.defaults != nil {
		r.defaults[key] = def
	}
}

func readParams(p Params) *paramReader {
	return &paramReader{p: p, seen: map[string]bool{}, gone: map[string]bool{}}
}

func (r *paramReader) raw(key string) (string, bool) {
	r.seen[key] = true
	v, ok := r.p[key]
	return v, ok
}

// Float reads a float parameter, or def when absent.
func (r *paramReader) Float(key string, def float64) float64 {
	v, ok := r.raw(key)
	if !ok {
		r.absent(key, def)
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		r.errs = append(r.errs, fmt.Sprintf("parameter %s=%q is not a number", key, v))
		return def
	}
	return f
}

// Int reads an integer parameter, or def when absent.
func (r *paramReader) Int(key string, def int) int {
	v, ok := r.raw(key)
	if !ok {
		r.absent(key, def)
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Sprintf("parameter %s=%q is not an integer", key, v))
		return def
	}
	return n
}

// Duration reads a Go duration parameter ("120s"), or def when absent.
func (r *paramReader) Duration(key string, def time.Duration) time.Duration {
	v, ok := r.raw(key)
	if !ok {
		r.absent(key, def)
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Sprintf("parameter %s=%q is not a duration such as 120s", key, v))
		return def
	}
	return d
}

// Bool reads a boolean parameter, or def when absent.
func (r *paramReader) Bool(key string, def bool) bool {
	v, ok := r.raw(key)
	if !ok {
		r.absent(key, def)
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Sprintf("parameter %s=%q is not true or false", key, v))
		return def
	}
	return b
}

// Gone records an error when key is set: a parameter that was removed, with what became of it,
// so that an old configuration fails with the fix instead of "unknown parameter".
func (r *paramReader) Gone(key, why string) {
	r.gone[key] = true
	if _, ok := r.raw(key); ok {
		r.errs = append(r.errs, fmt.Sprintf("parameter %s was removed: %s; delete it", key, why))
	}
}

// Require records an error unless cond holds.
func (r *paramReader) Require(cond bool, format string, args ...any) {
	if !cond {
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
	}
}

// Check returns the errors seen so far plus one for every key that was never read, naming the
// parameters the policy takes (not the removed ones) and the nearest of them.
func (r *paramReader) Check() error {
	var unknown []string
	for k := range r.p {
		if !r.seen[k] {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	var known []string
	for k := range r.seen {
		if !r.gone[k] {
			known = append(known, k)
		}
	}
	slices.Sort(known)
	for _, k := range unknown {
		switch near := suggest.Nearest(k, known); {
		case len(known) == 0:
			r.errs = append(r.errs, fmt.Sprintf("unknown parameter %q: the policy takes no parameters", k))
		case near != "":
			r.errs = append(r.errs, fmt.Sprintf("unknown parameter %q (did you mean %q? known: %s)", k, near, strings.Join(known, ", ")))
		default:
			r.errs = append(r.errs, fmt.Sprintf("unknown parameter %q (known: %s)", k, strings.Join(known, ", ")))
		}
	}
	if len(r.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(r.errs, "; "))
}
