package metrics

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
)

// TestErrorLabelsListed: every error type and code the router's code gives a request (the
// access line's error_type and error_code) is one of ErrorTypes and ErrorCodes, so that
// kvroute_request_errors_total names it rather than counting it as other. It reads the
// packages that set them: the string constants and literals passed to openai.NewError as
// type and code, and those assigned to a call's errType and errCode or to a variable named
// typ or code. A value passed through a parameter (the tenant gate's unauthorized) it cannot
// see: ErrorCodes lists those by hand.
func TestErrorLabelsListed(t *testing.T) {
	types, codes := errorLabelsIn(t, "../proxy", "../extproc", "../tenant", "../openai")
	// The scan sees what it should: values set each way (a literal, a constant of another
	// package, an assignment to errType, a tuple).
	for _, v := range []string{"stream_bad_event", "stream_cut", "stream_error", "client_write_stall", "upstream_error", "service_unavailable_error"} {
		if !types[v] {
			t.Errorf("the scan found no error type %q: it no longer reads the code as it is written", v)
		}
	}
	for _, v := range []string{"upstream_bad_answer", "upstream_connection_lost", "no_healthy_endpoint", "shutting_down", "multiple_api_keys"} {
		if !codes[v] {
			t.Errorf("the scan found no error code %q: it no longer reads the code as it is written", v)
		}
	}
	for v := range types {
		if !slices.Contains(ErrorTypes, v) {
			t.Errorf("error type %q is set by the router but not in ErrorTypes: it would be counted as %q", v, OtherError)
		}
	}
	for v := range codes {
		if !slices.Contains(ErrorCodes, v) {
			t.Errorf("error code %q is set by the router but not in ErrorCodes: it would be counted as %q", v, OtherError)
		}
	}
	for _, e := range slices.Concat(endpointErrors, refusalErrors) {
		if !slices.Contains(ErrorTypes, e.Type) || !slices.Contains(ErrorCodes, e.Code) {
			t.Errorf("%v is made at 0 but not listed", e)
		}
	}
}

// errorLabelsIn reads the non-test Go files of dirs for the error types and codes they set
// (TestErrorLabelsListed).
func errorLabelsIn(t *testing.T, dirs ...string) (types, codes map[string]bool) {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, dir := range dirs {
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(names) == 0 {
			t.Fatalf("no Go files in %s (%v)", dir, err)
		}
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	consts := map[string]string{} // string constants by name, of every package read
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, sp := range g.Specs {
					vs := sp.(*ast.ValueSpec)
					for i, v := range vs.Values {
						if s, ok := stringLit(v); ok && i < len(vs.Names) {
							consts[vs.Names[i].Name] = s
						}
					}
				}
			}
			return true
		})
	}
	value := func(e ast.Expr) (string, bool) {
		if s, ok := stringLit(e); ok {
			return s, true
		}
		switch x := e.(type) {
		case *ast.Ident:
			s, ok := consts[x.Name]
			return s, ok
		case *ast.SelectorExpr:
			s, ok := consts[x.Sel.Name]
			return s, ok
		}
		return "", false
	}
	types, codes = map[string]bool{}, map[string]bool{}
	into := func(lhs ast.Expr) map[string]bool {
		name := ""
		switch x := lhs.(type) {
		case *ast.Ident:
			name = x.Name
		case *ast.SelectorExpr:
			name = x.Sel.Name
		}
		switch name {
		case "errType", "typ":
			return types
		case "errCode", "code":
			return codes
		}
		return nil
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.CallExpr:
				fn := ""
				switch f := x.Fun.(type) {
				case *ast.Ident:
					fn = f.Name
				case *ast.SelectorExpr:
					fn = f.Sel.Name
				}
				if fn == "NewError" && len(x.Args) == 5 {
					if s, ok := value(x.Args[1]); ok {
						types[s] = true
					}
					if s, ok := value(x.Args[3]); ok {
						codes[s] = true
					}
				}
			case *ast.AssignStmt:
				if len(x.Lhs) == len(x.Rhs) {
					for i, l := range x.Lhs {
						if set := into(l); set != nil {
							if s, ok := value(x.Rhs[i]); ok {
								set[s] = true
							}
						}
					}
				}
			}
			return true
		})
	}
	return types, codes
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

// TestRequestErrorsBounded: error types and codes outside the lists, as engines send them,
// are counted as other: a thousand different ones make one series, not a thousand.
func TestRequestErrorsBounded(t *testing.T) {
	m, reg, _ := newTestMetrics()
	const ep = "http://127.0.0.1:1"
	m.EndpointAdded(ep, []string{"m"})
	before := testutil.CollectAndCount(m.RequestErrors)
	for i := range 1000 {
		m.RequestError("m", ep, "EngineError"+strconv.Itoa(i), "engine_code_"+strconv.Itoa(i))
	}
	m.RequestError("m", ep, "", "upstream_bad_answer") // no error type: not counted
	m.RequestError("m", ep, "stream_bad_event", "upstream_bad_answer")
	m.RequestError("m", ep, "upstream_error", "engine_code")
	if n := testutil.CollectAndCount(m.RequestErrors); n != before+2 {
		t.Errorf("%d series after 1000 engines' types, want %d (those at 0, other/other, upstream_error/other)", n, before+2)
	}
	got := map[string]float64{}
	for k, v := range metricstest.Values(t, reg, "kvroute_request_errors_total") {
		if v != 0 {
			got[k] = v
		}
	}
	want := map[string]float64{
		"kvroute_request_errors_total{endpoint=" + ep + ",error_code=other,error_type=other,model=m}":                          1000,
		"kvroute_request_errors_total{endpoint=" + ep + ",error_code=upstream_bad_answer,error_type=stream_bad_event,model=m}": 1,
		"kvroute_request_errors_total{endpoint=" + ep + ",error_code=other,error_type=upstream_error,model=m}":                 1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counted (-want +got):\n%s", diff)
	}
	lint(t, reg)
}

// TestRequestErrorsAtZero: an endpoint's engine failures are made at 0 per model it serves,
// the router's 502 and 503 causes with endpoint none per model; they go with the endpoint,
// and with the model once no endpoint serves it.
func TestRequestErrorsAtZero(t *testing.T) {
	m, reg, _ := newTestMetrics()
	series := func() []string {
		var out []string
		for k, v := range metricstest.Values(t, reg, "kvroute_request_errors_total") {
			if v != 0 {
				t.Errorf("%s = %v, want 0", k, v)
			}
			out = append(out, strings.TrimPrefix(k, "kvroute_request_errors_total"))
		}
		slices.Sort(out)
		return out
	}
	refusals := func(model string) []string {
		var out []string
		for _, e := range refusalErrors {
			out = append(out, "{endpoint=none,error_code="+e.Code+",error_type="+e.Type+",model="+model+"}")
		}
		return out
	}
	failures := func(ep, model string) []string {
		var out []string
		for _, e := range endpointErrors {
			out = append(out, "{endpoint="+ep+",error_code="+e.Code+",error_type="+e.Type+",model="+model+"}")
		}
		return out
	}
	sorted := func(s ...[]string) []string {
		out := slices.Concat(s...)
		slices.Sort(out)
		return out
	}
	if diff := cmp.Diff(sorted(refusals(UnknownModel)), series()); diff != "" {
		t.Errorf("at start (-want +got):\n%s", diff)
	}
	const a, b = "http://127.0.0.1:1", "http://127.0.0.1:2"
	m.EndpointAdded(a, []string{"m1"})
	m.EndpointAdded(b, []string{"m1", "m2"})
	want := sorted(refusals(UnknownModel), refusals("m1"), refusals("m2"), failures(a, "m1"), failures(b, "m1"), failures(b, "m2"))
	if diff := cmp.Diff(want, series()); diff != "" {
		t.Errorf("with a (m1) and b (m1, m2) (-want +got):\n%s", diff)
	}
	m.ForgetEndpoint(b)
	want = sorted(refusals(UnknownModel), refusals("m1"), failures(a, "m1"))
	if diff := cmp.Diff(want, series()); diff != "" {
		t.Errorf("after b left (-want +got):\n%s", diff)
	}
	m.EndpointAdded(a, []string{"m3"})
	want = sorted(refusals(UnknownModel), refusals("m3"), failures(a, "m3"))
	if diff := cmp.Diff(want, series()); diff != "" {
		t.Errorf("a re-added with m3 instead of m1 (-want +got):\n%s", diff)
	}
	// A request still in flight on b when it left is not counted: b's series stay deleted.
	m.RequestError("m1", b, "stream_cut", "")
	if diff := cmp.Diff(want, series()); diff != "" {
		t.Errorf("after a late error on b (-want +got):\n%s", diff)
	}
}
