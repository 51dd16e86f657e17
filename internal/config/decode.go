package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	yaml3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/suggest"
)

// Duration is a time.Duration written as a Go duration string ("5s", "250ms") in YAML.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes the duration as a string such as "5s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string such as "5s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as 5s: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

var durationType = reflect.TypeFor[Duration]()

// decodeStrict converts YAML to JSON (duplicate keys are errors), checks the whole document
// against the type of out (every unknown key and every mistyped value, each with its path),
// and decodes it. It returns all the problems it found, joined. When the document parsed and
// its top level has the right form, the problems come back as a *decodeError and out holds
// the rest of the document: each key with a problem left out, its field at the zero value (so
// the default), so that validation can still report the other problems of the file with
// these (see withValidation).
func decodeStrict(data []byte, out any) error {
	if n := documents(data); n > 1 {
		return fmt.Errorf("yaml: %d documents (separated by ---): a config is one document, and only the first would be read", n)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return yamlError(data, err)
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		js = []byte("{}")
	}
	var tree any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&tree); err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	var bad decodeError
	if !checkTree(reflect.TypeOf(out).Elem(), tree, "", &bad) {
		return errors.Join(bad.errs...) // the top level itself: nothing to decode
	}
	if len(bad.errs) > 0 {
		// What is left once checkTree took the problems out.
		if js, err = json.Marshal(tree); err != nil {
			return errors.Join(append(bad.errs, fmt.Errorf("decode: %w", err))...)
		}
	}
	dec = json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		// checkTree should have caught it; keep the decoder's word as a last resort.
		return errors.Join(append(bad.errs, fmt.Errorf("decode: %w", err))...)
	}
	if len(bad.errs) > 0 {
		return &bad
	}
	return nil
}

// decodeError is what decodeStrict found wrong in a document whose rest it decoded: unknown
// keys and values of the wrong type or form.
type decodeError struct {
	errs []error
	keys []string // the path of each of errs
}

func (e *decodeError) add(key string, err error) {
	e.errs = append(e.errs, err)
	e.keys = append(e.keys, key)
}

func (e *decodeError) Error() string   { return errors.Join(e.errs...).Error() }
func (e *decodeError) Unwrap() []error { return e.errs }

// decodedRest reports whether err, decodeStrict's, left the rest of the document decoded, so
// that it can be defaulted and validated too.
func decodedRest(err error) bool {
	var d *decodeError
	return errors.As(err, &d)
}

// withValidation joins the problems of decoding (derr, decodeStrict's, nil when none) and of
// validating what was decoded (verr): every problem in the file at once. A validation problem
// about a key that decoding reported (a mistyped endpoints[0].url, left empty, is "required"
// too) is left out: the first word on it says what to fix.
func withValidation(derr, verr error) error {
	var d *decodeError
	if !errors.As(derr, &d) {
		return errors.Join(derr, verr)
	}
	if verr == nil {
		return derr
	}
	errs := slices.Clone(d.errs)
	for _, v := range flatten(verr) {
		if p, ok := v.(*Problem); ok && slices.ContainsFunc(d.keys, func(k string) bool { return within(p.Key, k) }) {
			continue
		}
		errs = append(errs, v)
	}
	return errors.Join(errs...)
}

// within reports whether key is k or a key under it (k.x, k[0]).
func within(key, k string) bool {
	rest, ok := strings.CutPrefix(key, k)
	return ok && (rest == "" || rest[0] == '.' || rest[0] == '[')
}

// flatten returns the errors joined in err (err itself when it joins none).
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// listOfEndpoints reports whether data is a YAML document whose top level is a list of mappings
// with a url key: what a discovery file holds.
func listOfEndpoints(data []byte) bool {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil || !bytes.HasPrefix(bytes.TrimSpace(js), []byte("[")) {
		return false
	}
	var l []map[string]any
	if json.Unmarshal(js, &l) != nil {
		return false
	}
	return slices.ContainsFunc(l, func(m map[string]any) bool { _, ok := m["url"]; return ok })
}

// empty reports whether data is a YAML document without content: nothing, blank lines,
// comments, or a bare --- or null.
func empty(data []byte) bool {
	js, err := yaml.YAMLToJSONStrict(data)
	return err == nil && bytes.Equal(bytes.TrimSpace(js), []byte("null"))
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func rootName(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}

// jsonKind names a decoded JSON value for an error message.
func jsonKind(v any) string {
	switch v := v.(type) {
	case nil:
		return "nothing (null)"
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return fmt.Sprintf("the text %q", v)
	case bool:
		return fmt.Sprintf("the boolean %v", v)
	case json.Number:
		return "the number " + v.String()
	}
	return fmt.Sprintf("%T", v)
}

// fieldsOf maps the JSON names of a struct type's fields to their types.
func fieldsOf(t reflect.Type) (map[string]reflect.Type, []string) {
	m := map[string]reflect.Type{}
	var names []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
		names = append(names, name)
	}
	slices.Sort(names)
	return m, names
}

// checkTree checks a decoded JSON value v against Go type t, adding one problem per thing wrong
// to bad, and takes what is wrong out of v: an unknown or mistyped key is deleted from its
// mapping, a mistyped list element becomes null. It returns false when v itself cannot be
// decoded into t (the caller takes it out).
func checkTree(t reflect.Type, v any, path string, bad *decodeError) bool {
	if v == nil {
		return true // null leaves the zero value (and so the default)
	}
	if t == durationType {
		s, ok := v.(string)
		if !ok {
			bad.add(path, fmt.Errorf("%s: got %s, want a duration such as 5s or 250ms", path, jsonKind(v)))
			return false
		}
		if _, err := time.ParseDuration(s); err != nil {
			bad.add(path, fmt.Errorf("%s: %q is not a duration: write it like 5s, 250ms or 1m30s", path, s))
			return false
		}
		return true
	}
	switch t.Kind() {
	case reflect.Pointer:
		return checkTree(t.Elem(), v, path, bad)
	case reflect.Interface:
		// any: accepted as is; the owner checks it.
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			bad.add(path, fmt.Errorf("%s: got %s, want a mapping of keys", rootName(path), jsonKind(v)))
			return false
		}
		fields, names := fieldsOf(t)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			ft, ok := fields[k]
			if !ok {
				hint := ""
				if near := suggest.Nearest(k, names); near != "" {
					hint = fmt.Sprintf("did you mean %q? ", near)
				}
				bad.add(join(path, k), fmt.Errorf("%s: unknown key %q in %s (%sknown keys: %s)",
					join(path, k), k, rootName(path), hint, strings.Join(names, ", ")))
				delete(m, k)
				continue
			}
			if !checkTree(ft, m[k], join(path, k), bad) {
				delete(m, k)
			}
		}
	case reflect.Slice:
		l, ok := v.([]any)
		if !ok {
			bad.add(path, fmt.Errorf("%s: got %s, want a list", path, jsonKind(v)))
			return false
		}
		for i, e := range l {
			if !checkTree(t.Elem(), e, fmt.Sprintf("%s[%d]", path, i), bad) {
				l[i] = nil // not removed: the elements after it keep their index
			}
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			bad.add(path, fmt.Errorf("%s: got %s, want a mapping", path, jsonKind(v)))
			return false
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if !checkTree(t.Elem(), m[k], join(path, k), bad) {
				delete(m, k)
			}
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			bad.add(path, fmt.Errorf("%s: got %s, want text (quote it if it looks like a number or boolean)", path, jsonKind(v)))
			return false
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			bad.add(path, fmt.Errorf("%s: got %s, want true or false", path, jsonKind(v)))
			return false
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			bad.add(path, fmt.Errorf("%s: got %s, want a whole number", path, jsonKind(v)))
			return false
		}
		if _, err := n.Int64(); err != nil {
			bad.add(path, fmt.Errorf("%s: %s is not a whole number in range", path, n))
			return false
		}
	case reflect.Float32, reflect.Float64:
		n, ok := v.(json.Number)
		if !ok {
			bad.add(path, fmt.Errorf("%s: got %s, want a number", path, jsonKind(v)))
			return false
		}
		if _, err := n.Float64(); err != nil {
			bad.add(path, fmt.Errorf("%s: %s is not a number", path, n))
			return false
		}
	}
	return true
}

// documents counts the YAML documents in data; what does not parse counts as one (the JSON
// conversion then says what is wrong).
func documents(data []byte) int {
	dec := yaml3.NewDecoder(bytes.NewReader(data))
	n := 0
	for ; n < 2; n++ {
		var doc yaml3.Node
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return n
			}
			return max(n, 1)
		}
	}
	return n
}

// yamlError words a YAML syntax error once ("yaml: ", where the parser said "yaml: yaml: "),
// and names the usual cause of "cannot start any token": a tab in the indentation, which YAML
// does not allow.
func yamlError(data []byte, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if strings.Contains(msg, "cannot start any token") && bytes.Contains(data, []byte("\n\t")) {
		msg += " (a tab in the indentation? YAML indents with spaces only)"
	}
	return errors.New("yaml: " + msg)
}
