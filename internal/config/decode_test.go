package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDecodeStrict_DecodesTheRest: unknown keys and mistyped values are reported, each once,
// and the rest of the document is decoded all the same, so that validation can judge it too
// (an unknown key used to stop everything: health.interval: -5s beside it went unreported).
func TestDecodeStrict_DecodesTheRest(t *testing.T) {
	doc := `
bogus_key: 1
listen: 127.0.0.1:7000
health: {interval: -5s, timeout: soon}
endpoints:
  - {url: http://127.0.0.1:8001, kv_tokens: lots}
  - 5
  - {url: http://127.0.0.1:8003, modles: [m]}
`
	var c Config
	err := decodeStrict([]byte(doc), &c)
	if !decodedRest(err) {
		t.Fatalf("err = %v, want the problems with the rest decoded", err)
	}
	var d *decodeError
	errors.As(err, &d)
	wantKeys := []string{"bogus_key", "endpoints[0].kv_tokens", "endpoints[1]", "endpoints[2].modles", "health.timeout"}
	if diff := cmp.Diff(wantKeys, d.keys); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	for _, want := range []string{`bogus_key: unknown key "bogus_key" in the top level`, `health.timeout: "soon" is not a duration`,
		`endpoints[0].kv_tokens: got the text "lots", want a whole number`, `endpoints[1]: got the number 5, want a mapping of keys`,
		`endpoints[2].modles: unknown key "modles" in endpoints[2] (did you mean "models"?`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err lacks %q:\n%v", want, err)
		}
	}
	// The rest: what is right is there, what was wrong is left at zero, and a bad element
	// keeps its place so that the ones after it keep their index.
	if c.Listen != "127.0.0.1:7000" || c.Health.Interval != Duration(-5*time.Second) || c.Health.Timeout != 0 {
		t.Errorf("listen %q health %+v, want 127.0.0.1:7000 and interval -5s, timeout unset", c.Listen, c.Health)
	}
	got := make([]string, len(c.Endpoints))
	for i, ep := range c.Endpoints {
		got[i] = ep.URL
	}
	if diff := cmp.Diff([]string{"http://127.0.0.1:8001", "", "http://127.0.0.1:8003"}, got); diff != "" {
		t.Errorf("endpoints' URLs (-want +got):\n%s", diff)
	}
}

// TestDecodeStrict_Unusable: a document that does not parse, or whose top level is not a
// mapping, has no rest to decode.
func TestDecodeStrict_Unusable(t *testing.T) {
	for _, doc := range []string{"- a\n- b\n", "a: [1\n", "a: 1\n---\nb: 2\n"} {
		var c Config
		err := decodeStrict([]byte(doc), &c)
		if err == nil || decodedRest(err) {
			t.Errorf("%q: err = %v, want an error with nothing decoded", doc, err)
		}
	}
}

// TestWithValidation: the decoding problems first, then validation's, less those about a key
// decoding reported (or a key under it).
func TestWithValidation(t *testing.T) {
	d := &decodeError{}
	d.add("bogus_key", errors.New("bogus_key: unknown key"))
	d.add("endpoints[1]", errors.New("endpoints[1]: got the number 5, want a mapping of keys"))
	verr := errors.Join(
		&Problem{Key: "health.interval", Msg: "must be positive, like 5s"},
		&Problem{Key: "endpoints[1].url", Msg: "required"},
		&Problem{Key: "endpoints[10].url", Msg: "required"},
	)
	var got []string
	for _, e := range flatten(withValidation(d, verr)) {
		got = append(got, e.Error())
	}
	want := []string{"bogus_key: unknown key", "endpoints[1]: got the number 5, want a mapping of keys",
		"health.interval: must be positive, like 5s", "endpoints[10].url: required"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	if err := withValidation(nil, verr); err.Error() != verr.Error() {
		t.Errorf("without decoding problems: %v, want validation's alone", err)
	}
	if err := withValidation(d, nil); err != error(d) {
		t.Errorf("without validation problems: %v, want decoding's alone", err)
	}
	plain := errors.New("yaml: bad")
	if err := withValidation(plain, nil); err.Error() != "yaml: bad" {
		t.Errorf("a plain error: %v", err)
	}
}

// TestParse_EveryProblemAtOnce: an unknown key no longer hides the validation problems of the
// rest of the file (QA: bogus_key with health.interval: -5s reported the key alone), and a
// mistyped value is not reported a second time by validation (as missing).
func TestParse_EveryProblemAtOnce(t *testing.T) {
	_, err := Parse([]byte("endpoints: [{url: 5, engine: vllm}]\nbogus_key: 1\nhealth: {interval: -5s}\n"))
	if err == nil {
		t.Fatal("parsed")
	}
	for _, want := range []string{`bogus_key: unknown key "bogus_key"`, "health.interval: must be positive", "endpoints[0].url: got the number 5, want text"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err lacks %q:\n%v", want, err)
		}
	}
	if n := strings.Count(err.Error(), "endpoints[0].url"); n != 1 {
		t.Errorf("endpoints[0].url reported %d times, want once:\n%v", n, err)
	}
	if got := Problems(err); len(got) != 1 || got[0].Key != "health.interval" {
		t.Errorf("Problems = %v, want validation's one (health.interval)", got)
	}
}
