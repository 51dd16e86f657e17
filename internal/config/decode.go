package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// and only then decodes it. It returns all the problems it found, joined.
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
	var errs []error
	checkTree(reflect.TypeOf(out).Elem(), tree, "", &errs)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	dec = json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		// checkTree should have caught it; keep the decoder's word as a last resort.
		return fmt.Errorf("decode: %w", err)
	}
	return nil
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

// checkTree checks a decoded JSON value v against Go type t, appending one error per problem.
func checkTree(t reflect.Type, v any, path string, errs *[]error) {
	if v == nil {
		return // null leaves the zero value (and so the default)
	}
	if t == durationType {
		s, ok := v.(string)
		if !ok {
			*errs = append(*errs, fmt.Errorf("%s: got %s, want a duration such as 5s or 250ms", path, jsonKind(v)))
			return
		}
		if _, err := time.ParseDuration(s); err != nil {
			*errs = append(*errs, fmt.Errorf("%s: %q is not a duration: write it like 5s, 250ms or 1m30s", path, s))
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		checkTree(t.Elem(), v, path, errs)
	case reflect.Interface:
		// any: accepted as is; the owner checks it.
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			*errs = append(*errs, fmt.Errorf("%s: got %s, want a mapping of keys", rootName(path), jsonKind(v)))
			return
		}
		fields, names := fieldsOf(t)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				hint := ""
				if near := suggest.Nearest(k, names); near != "" {
					hint = fmt.Sprintf("did you mean %q? ", near)
				}
				*errs = append(*errs, fmt.Errorf("%s: unknown key %q in %s (%sknown keys: %s)",
					join(path, k), k, rootName(path), hint, strings.Join(names, ", ")))
				continue
			}
			checkTree(ft, m[k], join(path, k), errs)
		}
	case reflect.Slice:
		l, ok := v.([]any)
		if !ok {
			*errs = append(*errs, fmt.Errorf("%s: got %s, want a list", path, jsonKind(v)))
			return
		}
		for i, e := range l {
			checkTree(t.Elem(), e, fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			*errs = append(*errs, fmt.Errorf("%s: got %s, want a mapping", path, jsonKind(v)))
			return
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			checkTree(t.Elem(), m[k], join(path, k), errs)
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			*errs = append(*errs, fmt.Errorf("%s: got %s, want text (quote it if it looks like a number or boolean)", path, jsonKind(v)))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			*errs = append(*errs, fmt.Errorf("%s: got %s, want true or false", path, jsonKind(v)))
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			*errs = append(*errs, fmt.Errorf("%s: got %s, want a whole number", path, jsonKind(v)))
			return
		}
		if _, err := n.Int64(); err != nil {
			*errs = append(*errs, fmt.Errorf("%s: %s is not a whole number in range", path, n))
		}
	case reflect.Float32, reflect.Float64:
		n, ok := v.(json.Number)
		if !ok {
			*errs = append(*errs, fmt.Errorf("%s: got %s, want a number", path, jsonKind(v)))
			return
		}
		if _, err := n.Float64(); err != nil {
			*errs = append(*errs, fmt.Errorf("%s: %s is not a number", path, n))
		}
	}
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
