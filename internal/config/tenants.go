package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Auth modes.
const (
	AuthAPIKey = "api_key"
	AuthNone   = "none"
)

// MinSecretBytes is the shortest server secret accepted: 256 bits, as vLLM asks of cache salts.
const MinSecretBytes = 32

// Auth says how clients authenticate and where the server secret for cache salts comes from.
type Auth struct {
	// Mode is api_key (clients send a tenant's API key) or none (no authentication). Default:
	// api_key when tenants are listed; none when there are none (with a warning unless the auth
	// section says so).
	Mode string `json:"mode"`
	// SecretFile holds the server secret from which per-tenant cache salts are derived (at
	// least 32 bytes). Never put the secret itself in the config.
	SecretFile string `json:"secret_file"`
	// SecretEnv names an environment variable holding the secret instead.
	SecretEnv string `json:"secret_env"`
}

// Tenant is one customer of the fleet.
type Tenant struct {
	// Name identifies the tenant in logs and metrics: letters, digits, '.', '_' and '-'.
	Name string `json:"name"`
	// APIKeys are the SHA-256 digests of the tenant's keys, "sha256:<64 hex>" (print one with
	// `kvroute hash-key`). The keys themselves never appear in the config.
	APIKeys []string `json:"api_keys"`
	// Limits bound the tenant's use; 0 means unlimited.
	Limits TenantLimits `json:"limits"`
	// Priority orders waiting requests under overload (higher first). Default 0.
	Priority int `json:"priority"`
	// Models the tenant may use; empty means all.
	Models []string `json:"models"`
	// EndpointLabels restrict the tenant to endpoints carrying all these labels.
	EndpointLabels map[string]string `json:"endpoint_labels"`
	// AllowFields are the EngineFields the tenant may send to the engine; the others are
	// removed from its requests' bodies. Empty: none (docs/security.md, "Engine fields").
	AllowFields []string `json:"allow_fields"`
}

// EngineFields are the members of a request body that act on the engine beyond the request
// itself, on what every request sharing the engine gets: vLLM's and SGLang's priority
// scheduling (priority: one queue for every tenant on the engine), and disaggregated serving's
// parameters (vLLM's kv_transfer_params and ec_transfer_params, SGLang's bootstrap_*: the peer
// to reach and the blocks to read). A tenant's requests reach the engine without them unless
// its allow_fields names them.
var EngineFields = []string{"priority", "kv_transfer_params", "ec_transfer_params",
	"bootstrap_host", "bootstrap_port", "bootstrap_room"}

// TenantLimits bound one tenant; 0 means unlimited. Requests and tokens per minute and
// max_concurrent are the fleet's with replicas that sync (peers, tenant_limits fleet, the
// default): each replica enforces limit / replicas alive, rounded up, at least 1. Without
// peers, or with peers.tenant_limits replica, each replica enforces them whole.
type TenantLimits struct {
	RequestsPerMinute int `json:"requests_per_minute"`
	TokensPerMinute   int `json:"tokens_per_minute"`
	MaxConcurrent     int `json:"max_concurrent"`
	// MaxOutputTokens caps the completion tokens of each sequence of the tenant's requests: one
	// that sets no max_tokens (max_completion_tokens, max_output_tokens) reaches the engine with
	// max_tokens set to it, and is reserved it against tokens_per_minute; one that asks for more
	// is refused with 400. Without it, a request without max_tokens may generate what its
	// engine allows (vLLM: the rest of the context), which tokens_per_minute only learns when it
	// ends.
	MaxOutputTokens int `json:"max_output_tokens"`
}

// Overload configures admission when the fleet is saturated.
type Overload struct {
	// QueueSize is how many requests may wait for admission. Default 1024.
	QueueSize int `json:"queue_size"`
	// MaxWait is how long a request may wait for admission before a 503 with Retry-After.
	// Default 30s.
	MaxWait Duration `json:"max_wait"`
	// MaxPredictedTTFT counts the fleet as saturated while every candidate's predicted TTFT is
	// above it: requests then wait in the admission queue (0: off).
	MaxPredictedTTFT Duration `json:"max_predicted_ttft"`
	// MaxWaitingPerEndpoint holds requests back while every candidate has more than this many
	// requests waiting in the engine (scraped; 0: off).
	MaxWaitingPerEndpoint int `json:"max_waiting_per_endpoint"`
}

// AuthMode returns the effective auth mode (after defaults).
func (c *Config) AuthMode() string {
	if c.Auth == nil {
		return AuthNone
	}
	return c.Auth.Mode
}

type authSection struct{ c *Config }

func (a authSection) setDefaults(c *Config) {
	if c.Auth == nil {
		if len(c.Tenants) == 0 {
			c.Auth = &Auth{Mode: AuthNone}
			c.Warnings = append(c.Warnings, "auth: no tenants and no auth section: every client is accepted without an API key; write auth: {mode: none} to say so, or list tenants")
			return
		}
		c.Auth = &Auth{}
	}
	if c.Auth.Mode == "" {
		if len(c.Tenants) == 0 {
			c.Auth.Mode = AuthNone
			if c.Auth.SecretFile != "" || c.Auth.SecretEnv != "" {
				c.Warnings = append(c.Warnings, "auth: a secret is set but no tenant is listed: every client is accepted without an API key; list tenants with api_keys to require one, or write auth: {mode: none} to say so")
			}
		} else {
			c.Auth.Mode = AuthAPIKey
		}
	}
}

func (a authSection) validate(c *Config, p *problems) {
	au := c.Auth
	if au == nil {
		return
	}
	switch au.Mode {
	case AuthNone:
		if len(c.Tenants) > 0 {
			p.add("auth.mode", "none, but tenants are listed: use api_key, or remove the tenants")
		}
	case AuthAPIKey:
		if len(c.Tenants) == 0 {
			p.add("tenants", "auth.mode is api_key but no tenant is listed: add a tenant with api_keys, or set auth.mode: none")
		}
		if au.SecretFile == "" && au.SecretEnv == "" {
			p.add("auth", "no server secret for the tenants' cache salts: set secret_file (a file of at least %d random bytes) or secret_env", MinSecretBytes)
		}
	default:
		p.add("auth.mode", "%q: use api_key or none", au.Mode)
	}
	if au.SecretFile != "" && au.SecretEnv != "" {
		p.add("auth", "both secret_file and secret_env are set: keep one")
	}
}

// Secret reads the server secret from auth.secret_file or the variable auth.secret_env (via
// getenv, os.Getenv when nil). It is at least MinSecretBytes long (surrounding white space is
// trimmed).
func (c *Config) Secret(getenv func(string) string) ([]byte, error) {
	if c.Auth == nil {
		return nil, fmt.Errorf("auth: no secret_file or secret_env configured")
	}
	return readSecret(c, "auth", c.Auth.SecretFile, c.Auth.SecretEnv, getenv)
}

var tenantName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

type tenantList struct{ c *Config }

// KeyDigest returns the form an API key takes in tenants[].api_keys: "sha256:" and the
// lowercase hex SHA-256 of the key.
func KeyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// setDefaults lowercases the key digests (so that they compare equal to KeyDigest's) and warns
// about tenants that no static endpoint can serve (discovery may still add one, so it is not
// an error).
func (tenantList) setDefaults(c *Config) {
	for i := range c.Tenants {
		for j, k := range c.Tenants[i].APIKeys {
			if rest, ok := strings.CutPrefix(k, "sha256:"); ok {
				c.Tenants[i].APIKeys[j] = "sha256:" + strings.ToLower(rest)
			}
		}
	}
	// Models the endpoints say they serve, when every one says (an endpoint without models
	// learns them from the engine, and discovery may add more: then nothing can be told here).
	served := map[string]bool{}
	d := c.Discovery
	allListed := len(c.Endpoints) > 0 && d.File == "" && len(d.DNS) == 0 && len(d.Kubernetes) == 0 && d.InferencePool == nil
	for _, e := range c.Endpoints {
		allListed = allListed && len(e.Models) > 0
		for _, m := range e.Models {
			served[m] = true
		}
	}
	for i, t := range c.Tenants {
		if l := t.Limits; l.TokensPerMinute > 0 && l.MaxOutputTokens > l.TokensPerMinute {
			c.Warnings = append(c.Warnings, fmt.Sprintf("tenants[%d].limits.max_output_tokens: %d is more than tokens_per_minute (%d): one answer of tenant %q may take more than a minute's tokens, which it then owes (its next requests wait); lower it to at most %d to keep each minute within the limit", i, l.MaxOutputTokens, l.TokensPerMinute, t.Name, l.TokensPerMinute))
		}
		for j, m := range t.Models {
			if allListed && strings.TrimSpace(m) != "" && !served[m] {
				c.Warnings = append(c.Warnings, fmt.Sprintf("tenants[%d].models[%d]: no configured endpoint serves %q: tenant %q cannot use it (a typo?)", i, j, m, t.Name))
			}
		}
		if len(t.EndpointLabels) == 0 {
			continue
		}
		found := false
		for _, e := range c.Endpoints {
			match := true
			for k, v := range t.EndpointLabels {
				if e.Labels[k] != v {
					match = false
					break
				}
			}
			if match {
				found = true
				break
			}
		}
		if !found {
			c.Warnings = append(c.Warnings, fmt.Sprintf("tenants[%d].endpoint_labels: no configured endpoint carries all of %v: tenant %q gets no endpoint unless discovery adds one", i, t.EndpointLabels, t.Name))
		}
	}
}

func (tenantList) validate(c *Config, p *problems) {
	names := map[string]int{}
	keys := map[string]string{}
	for i, t := range c.Tenants {
		at := fmt.Sprintf("tenants[%d]", i)
		switch {
		case t.Name == "":
			p.add(at+".name", "missing: give the tenant a name")
		case !tenantName.MatchString(t.Name):
			p.add(at+".name", "%q: use 1-64 letters, digits, '.', '_' or '-'", t.Name)
		}
		if j, dup := names[t.Name]; dup && t.Name != "" {
			p.add(at+".name", "%q is also tenants[%d].name: names must be unique", t.Name, j)
		} else {
			names[t.Name] = i
		}
		if len(t.APIKeys) == 0 && c.AuthMode() == AuthAPIKey {
			p.add(at+".api_keys", "no key: add one as sha256:<64 hex> (print it with `kvroute hash-key`)")
		}
		for j, k := range t.APIKeys {
			kat := fmt.Sprintf("%s.api_keys[%d]", at, j)
			if err := checkKeyHash(k); err != nil {
				p.add(kat, "%v: store the key's digest, printed by `kvroute hash-key`, never the key itself", err)
				continue
			}
			norm := strings.ToLower(k)
			if other, dup := keys[norm]; dup {
				p.add(kat, "the same key is also %s: a key belongs to one tenant", other)
			} else {
				keys[norm] = kat
			}
		}
		for _, f := range []struct {
			key string
			v   int
		}{{"requests_per_minute", t.Limits.RequestsPerMinute}, {"tokens_per_minute", t.Limits.TokensPerMinute}, {"max_concurrent", t.Limits.MaxConcurrent}, {"max_output_tokens", t.Limits.MaxOutputTokens}} {
			if f.v < 0 {
				p.add(at+".limits."+f.key, "%d is negative: use 0 for unlimited", f.v)
			}
		}
		for j, m := range t.Models {
			if strings.TrimSpace(m) == "" {
				p.add(fmt.Sprintf("%s.models[%d]", at, j), "empty model name: remove it")
			}
		}
		for j, f := range t.AllowFields {
			if !slices.Contains(EngineFields, f) {
				p.add(fmt.Sprintf("%s.allow_fields[%d]", at, j), "%q: use one of %s (the other body fields always reach the engine)", f, strings.Join(EngineFields, ", "))
			}
		}
	}
}

// checkKeyHash checks the form "sha256:<64 hex>".
func checkKeyHash(k string) error {
	hexPart, ok := strings.CutPrefix(k, "sha256:")
	if !ok {
		return fmt.Errorf("%s does not start with \"sha256:\"", redact(k))
	}
	if len(hexPart) != 64 {
		return fmt.Errorf("sha256:... has %d hex digits, want 64", len(hexPart))
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return fmt.Errorf("sha256:... is not hexadecimal")
	}
	return nil
}

// redact names a value that may be a secret key pasted by mistake without showing it.
func redact(s string) string { return fmt.Sprintf("the value (%d characters)", len(s)) }

func (o *Overload) setDefaults(*Config) {
	if o.QueueSize == 0 {
		o.QueueSize = DefaultOverloadQueue
	}
	if o.MaxWait == 0 {
		o.MaxWait = Duration(30 * time.Second)
	}
}

func (o *Overload) validate(_ *Config, p *problems) {
	if o.QueueSize < 0 {
		p.add("overload.queue_size", "%d is negative: give the number of requests that may wait", o.QueueSize)
	}
	if o.MaxWait < 0 {
		p.add("overload.max_wait", "must be positive, like 30s")
	}
	if o.MaxPredictedTTFT < 0 {
		p.add("overload.max_predicted_ttft", "must be positive, like 5s, or 0 for off")
	}
	if o.MaxWaitingPerEndpoint < 0 {
		p.add("overload.max_waiting_per_endpoint", "%d is negative: use 0 for off", o.MaxWaitingPerEndpoint)
	}
}
