package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const keyA = "sha256:" + "aa00000000000000000000000000000000000000000000000000000000000001"
const keyB = "sha256:" + "bb00000000000000000000000000000000000000000000000000000000000002"

func TestTenants_Valid(t *testing.T) {
	c, err := Parse([]byte(minimal + `
auth: {secret_env: KVROUTE_SECRET}
tenants:
  - name: acme
    api_keys: [` + keyA + `]
    limits: {requests_per_minute: 600, tokens_per_minute: 100000, max_concurrent: 8}
    priority: 2
    models: [llama3-70b]
    endpoint_labels: {pool: dedicated}
    allow_fields: [priority]
  - name: beta
    api_keys: [` + keyB + `]
overload: {queue_size: 10, max_wait: 5s, max_predicted_ttft: 3s, max_waiting_per_endpoint: 16}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "tenants[0].endpoint_labels: no configured endpoint carries all of map[pool:dedicated]") {
		t.Errorf("warnings = %q, want one about acme's labels", c.Warnings)
	}
	// A model no endpoint serves (a typo) is said too, when every endpoint names its models.
	c2, err := Parse([]byte(minimal + "auth: {secret_env: K}\ntenants: [{name: acme, api_keys: [" + keyA + "], models: [llama3-70B]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c2.Warnings) != 1 || !strings.Contains(c2.Warnings[0], `tenants[0].models[0]: no configured endpoint serves "llama3-70B"`) {
		t.Errorf("warnings = %q, want one about the model no endpoint serves", c2.Warnings)
	}
	if c.AuthMode() != AuthAPIKey {
		t.Errorf("auth mode = %q, want api_key by default with tenants", c.AuthMode())
	}
	if c.Tenants[0].Limits.TokensPerMinute != 100000 || c.Overload.MaxPredictedTTFT.D().Seconds() != 3 {
		t.Errorf("tenant or overload not decoded: %+v %+v", c.Tenants[0], c.Overload)
	}
	secret := strings.Repeat("s", 40)
	got, err := c.Secret(func(k string) string {
		if k == "KVROUTE_SECRET" {
			return secret + "\n"
		}
		return ""
	})
	if err != nil || string(got) != secret {
		t.Errorf("secret = %q, %v; want the trimmed variable", got, err)
	}
	if _, err := c.Secret(func(string) string { return "short" }); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("short secret: err = %v", err)
	}
}

func TestTenants_SecretFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte(strings.Repeat("k", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "kvroute.yaml")
	doc := minimal + "auth: {secret_file: secret}\ntenants: [{name: a, api_keys: [" + keyA + "]}]\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Secret(nil)
	if err != nil || len(s) != 32 {
		t.Errorf("secret = %d bytes, %v; want 32 from the file beside the config", len(s), err)
	}
}

// TestReadSecrets: with Checks.ReadSecrets, a secret that does not read or is too short, and
// a picker's certificate that does not load, are reported with the config's other problems, not after them when the router starts; without
// it the secrets are not read.
func TestReadSecrets(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{"short": "short", "good": strings.Repeat("k", 32)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	doc := "endpoints: [{url: ftp://x}]\nauth: {secret_file: short}\ntenants: [{name: a, api_keys: [" + keyA + "]}]\n" +
		"peers: {listen: ':7947', secret_file: missing, accept_secret_env: KVROUTE_TEST_UNSET_VARIABLE}\n" +
		"extproc: {listen: ':9002', tls: {cert_file: missing.pem, key_file: missing.key}}\n"
	path := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadWith(path, nil, Checks{ReadSecrets: true})
	var got []string
	for _, p := range Problems(err) {
		got = append(got, p.Key)
	}
	if diff := cmp.Diff([]string{"endpoints[0].url", "extproc.tls", "auth.secret_file", "peers.secret_file", "peers.accept_secret_env"}, got); diff != "" {
		t.Errorf("problems' keys (-want +got):\n%s\n%v", diff, err)
	}
	for _, want := range []string{
		"auth.secret_file: " + filepath.Join(dir, "short") + ": the secret is 5 bytes, want at least 32",
		"peers.secret_file: " + filepath.Join(dir, "missing") + ": open ",
		"peers.accept_secret_env: KVROUTE_TEST_UNSET_VARIABLE: the variable is not set",
		"extproc.tls: cannot load the certificate and key: open " + filepath.Join(dir, "missing.pem"),
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	_, err = LoadWith(path, nil, Checks{})
	if got := Problems(err); len(got) != 1 || got[0].Key != "endpoints[0].url" {
		t.Errorf("without ReadSecrets: problems %v, want the URL's alone", got)
	}
	good := strings.Replace(strings.Replace(doc, "short", "good", 1), "ftp://x", "http://127.0.0.1:1", 1)
	good = strings.Replace(good, "secret_file: missing, accept_secret_env: KVROUTE_TEST_UNSET_VARIABLE", "secret_file: good", 1)
	good = strings.Replace(good, "tls: {cert_file: missing.pem, key_file: missing.key}", "tls: {self_signed: true}", 1)
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadWith(path, nil, Checks{ReadSecrets: true}); err != nil {
		t.Errorf("good secrets: %v", err)
	}
}

func TestTenants_Problems(t *testing.T) {
	_, err := Parse([]byte(minimal + `
auth: {mode: api_key}
tenants:
  - name: acme
    api_keys: [sk-live-123456, "sha256:abc", ` + keyA + `]
    limits: {requests_per_minute: -1}
    allow_fields: [priority, Priority, max_tokens]
  - name: acme
    api_keys: [` + keyA + `]
  - name: "bad name"
    api_keys: [` + "sha256:" + strings.Repeat("zz", 32) + `]
  - name: nokey
overload: {queue_size: -1}
`))
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	for _, want := range []string{
		"auth: no server secret",
		"tenants[0].api_keys[0]: the value (14 characters) does not start with \"sha256:\"",
		"kvroute hash-key",
		"tenants[0].api_keys[1]: sha256:... has 3 hex digits, want 64",
		"tenants[0].limits.requests_per_minute: -1 is negative",
		`tenants[0].allow_fields[1]: "Priority": use one of priority, kv_transfer_params,`,
		`tenants[0].allow_fields[2]: "max_tokens": use one of`,
		`tenants[1].name: "acme" is also tenants[0].name`,
		"tenants[1].api_keys[0]: the same key is also tenants[0].api_keys[2]",
		`tenants[2].name: "bad name"`,
		"tenants[2].api_keys[0]: sha256:... is not hexadecimal",
		"tenants[3].api_keys: no key",
		"overload.queue_size: -1 is negative",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q; got:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "sk-live") {
		t.Errorf("error shows a pasted API key:\n%s", msg)
	}
}

func TestTenants_AuthModes(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"auth: {mode: none}\ntenants: [{name: a, api_keys: [" + keyA + "]}]\n", "auth.mode: none, but tenants are listed"},
		{"auth: {mode: api_key, secret_env: X}\n", "tenants: auth.mode is api_key but no tenant"},
		{"auth: {mode: basic}\n", `auth.mode: "basic": use api_key or none`},
		{"auth: {secret_env: X, secret_file: s.key}\ntenants: [{name: a, api_keys: [" + keyA + "]}]\n", "both secret_file and secret_env"},
	} {
		_, err := Parse([]byte(minimal + tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.doc, err, tc.want)
		}
	}
}

func TestKeyDigest(t *testing.T) {
	// The example config's digest of the word foo.
	if got, want := KeyDigest("foo"), "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"; got != want {
		t.Errorf("KeyDigest(foo) = %q, want %q", got, want)
	}
	c, err := Parse([]byte(minimal + "auth: {secret_env: X}\ntenants: [{name: a, api_keys: [" + strings.ToUpper(KeyDigest("k"))[:7] + strings.ToUpper(KeyDigest("k")[7:]) + "]}]\n"))
	if err == nil {
		t.Fatalf("SHA256: prefix in capitals should be rejected, got %+v", c.Tenants)
	}
	c, err = Parse([]byte(minimal + "auth: {secret_env: X}\ntenants: [{name: a, api_keys: [sha256:" + strings.ToUpper(KeyDigest("k")[7:]) + "]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Tenants[0].APIKeys[0]; got != KeyDigest("k") {
		t.Errorf("digest = %q, want it lowercased to %q", got, KeyDigest("k"))
	}
}

// limits.max_output_tokens: decoded, 0 for no cap; negative is an error that says the fix; a
// cap above tokens_per_minute is taken with a warning (the tenant may mean a long answer now
// and then, which its limit then settles as a debt), one at or under it, or with no
// tokens_per_minute, without one.
func TestTenantMaxOutputTokens(t *testing.T) {
	tenant := func(limits string) string {
		return minimal + "auth: {secret_env: K}\ntenants: [{name: acme, api_keys: [" + keyA + "], limits: {" + limits + "}}]\n"
	}
	for _, tc := range []struct {
		limits  string
		want    int
		warning string
	}{
		{"tokens_per_minute: 10000, max_output_tokens: 500", 500, ""},
		{"tokens_per_minute: 10000, max_output_tokens: 10000", 10000, ""},
		{"max_output_tokens: 50000", 50000, ""},
		{"tokens_per_minute: 10000", 0, ""},
		{"tokens_per_minute: 10000, max_output_tokens: 20000", 20000,
			`tenants[0].limits.max_output_tokens: 20000 is more than tokens_per_minute (10000): one answer of tenant "acme" may take more than a minute's tokens, which it then owes (its next requests wait); lower it to at most 10000 to keep each minute within the limit`},
	} {
		c, err := Parse([]byte(tenant(tc.limits)))
		if err != nil {
			t.Errorf("%s: %v", tc.limits, err)
			continue
		}
		if got := c.Tenants[0].Limits.MaxOutputTokens; got != tc.want {
			t.Errorf("%s: max_output_tokens %d, want %d", tc.limits, got, tc.want)
		}
		var want []string
		if tc.warning != "" {
			want = []string{tc.warning}
		}
		if diff := cmp.Diff(want, c.Warnings); diff != "" {
			t.Errorf("%s: warnings (-want +got):\n%s", tc.limits, diff)
		}
	}
	_, err := Parse([]byte(tenant("tokens_per_minute: 10000, max_output_tokens: -1")))
	if err == nil || !strings.Contains(err.Error(), "tenants[0].limits.max_output_tokens: -1 is negative: use 0 for unlimited") {
		t.Errorf("max_output_tokens -1: err = %v, want the field and the fix", err)
	}
}
