package config

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Engines returns the engine kinds an endpoint may declare. "auto" asks the router to detect
// the kind on first contact (see scrape.Detect).
func Engines() []string {
	return []string{"vllm", "sglang", "tgi", "llamacpp", "ollama", "openai", "auto"}
}

// Config is the whole router configuration. Zero values are replaced by the documented
// defaults when the config is loaded; examples/kvroute.yaml documents every key.
type Config struct {
	// Listen is the OpenAI API address (host:port). Default 127.0.0.1:8080.
	Listen string `json:"listen"`
	// AdminListen serves /metrics, /healthz, /readyz, /debug/endpoints. Default 127.0.0.1:9090.
	AdminListen string `json:"admin_listen"`
	// Policy is the routing policy and its parameters.
	Policy Policy `json:"policy"`
	// Endpoints are the static inference endpoints.
	Endpoints []Endpoint `json:"endpoints"`
	// Discovery adds endpoints from a file that is reloaded when it changes, and from DNS names.
	Discovery Discovery `json:"discovery"`
	// Health configures active health checks and passive ejection.
	Health Health `json:"health"`
	// Scrape configures the scraping of the engines' /metrics.
	Scrape Scrape `json:"scrape"`
	// Prefix configures how prompts become prefix blocks.
	Prefix Prefix `json:"prefix"`
	// Normalize configures prompt normalisation before hashing.
	Normalize Normalize `json:"normalize"`
	// Limits bounds request bodies and retries.
	Limits Limits `json:"limits"`
	// Server holds the HTTP servers' timeouts.
	Server Server `json:"server"`
	// Log configures logging.
	Log Log `json:"log"`
	// Pprof serves /debug/pprof on the admin listener when true.
	Pprof bool `json:"pprof"`
	// Auth says how clients authenticate (see tenants.go). Nil when the section is absent;
	// defaults then fill AuthMode.
	Auth *Auth `json:"auth,omitempty"`
	// Tenants are the customers of the fleet (see tenants.go).
	Tenants []Tenant `json:"tenants"`
	// Overload configures admission under overload (see tenants.go).
	Overload Overload `json:"overload"`
	// ExtProc serves the Envoy ext_proc endpoint picker (see extproc.go).
	ExtProc ExtProc `json:"extproc"`
	// Peers makes this router one of several replicas that share what they learn (see
	// peers.go). Nil when the section is absent: a lone router.
	Peers *Peers `json:"peers,omitempty"`
	// Autoscale configures what autoscalers get from the router (see autoscale.go).
	Autoscale Autoscale `json:"autoscale"`

	// Warnings are problems that are not errors (for example authentication off by default);
	// the caller logs them. Filled by Parse and Load.
	Warnings []string `json:"-"`
	// Dir is the directory relative paths are resolved against ("" for Parse: the working
	// directory).
	Dir string `json:"-"`
}

// Policy names the routing policy and its parameters.
type Policy struct {
	// Name is a registered policy name (Checks.PolicyNames). Default prefix-aware.
	Name string `json:"name"`
	// Params are the policy's parameters: scalars (text, numbers, booleans).
	Params map[string]any `json:"params"`
}

// Endpoint is one inference endpoint.
type Endpoint struct {
	// URL is the engine's base URL, http or https (a trailing slash is removed).
	URL string `json:"url"`
	// Models it serves; empty means the ones the engine lists at GET /v1/models (any model
	// until it has answered).
	Models []string `json:"models"`
	// Engine is vllm, sglang, tgi, llamacpp, ollama, openai (generic) or auto (detected on
	// first contact). Default openai.
	Engine string `json:"engine"`
	// Labels select dedicated pools (tenants' endpoint_labels).
	Labels map[string]string `json:"labels"`
	// KVTokens overrides the KV capacity in tokens (0: use the scraped cache_config_info).
	KVTokens int `json:"kv_tokens"`
	// StepTokens is the tokens the engine computes in one step under chunked prefill, in its
	// own tokens (vLLM max_num_batched_tokens, SGLang chunked_prefill_size, TGI
	// max_batch_prefill_tokens, llama.cpp --batch-size, ollama num_batch). 0: unset, the
	// engine kind's documented default where there is a stable one (ollama 512, llamacpp
	// 2048), else prefix-aware's step_tokens.
	StepTokens int `json:"step_tokens"`
	// CacheSalt says whether to inject the tenant's cache_salt into requests. Default true for
	// vllm, and for auto once the engine is found to be vLLM; false otherwise (engines that
	// reject unknown fields would fail).
	CacheSalt *bool `json:"cache_salt"`
	// HealthPath overrides the engine's health check path.
	HealthPath string `json:"health_path"`
	// MetricsPath overrides the metrics path (default /metrics; "-" turns scraping off).
	MetricsPath string `json:"metrics_path"`
	// FirstTokenTimeout and ResponseTimeout override limits.first_token_timeout and
	// limits.response_timeout for this endpoint (0: those).
	FirstTokenTimeout Duration `json:"first_token_timeout"`
	ResponseTimeout   Duration `json:"response_timeout"`
}

// Discovery finds more endpoints: in a file, behind DNS names, and in Kubernetes.
type Discovery struct {
	// File is a YAML file with a list of endpoints (same keys as endpoints[]); relative to the
	// config file's directory. Empty: no file discovery.
	File string `json:"file"`
	// PollInterval re-reads the file this often besides change notifications (for file systems
	// that do not notify). Default 30s.
	PollInterval Duration `json:"poll_interval"`
	// DNS lists host names whose addresses are endpoints, one per A or AAAA record, resolved
	// again every interval: a Kubernetes headless service, a Compose service scaled to N.
	DNS []DNSDiscovery `json:"dns"`
	// Kubernetes lists EndpointSlice watches (see kubernetes.go): the ready endpoints of a
	// Service, or of the Services a label selector picks, followed as pods come and go.
	Kubernetes []KubernetesDiscovery `json:"kubernetes"`
	// InferencePool follows the pods of a Gateway API InferencePool (see inferencepool.go).
	InferencePool *InferencePoolDiscovery `json:"inference_pool"`
}

// DNSDiscovery is one name to resolve into endpoints.
type DNSDiscovery struct {
	// Name is the host name (no scheme, no port), like vllm.inference.svc.cluster.local.
	Name string `json:"name"`
	// Port the engines listen on.
	Port int `json:"port"`
	// Scheme of the endpoints' URLs: http (default) or https.
	Scheme string `json:"scheme"`
	// Interval between two resolutions. Default 10s; at least 1s.
	Interval Duration `json:"interval"`
	// Family is the address family whose addresses are endpoints: auto (default: the IPv4
	// addresses when the name has any, else the IPv6 ones, so a dual-stack pod is one endpoint
	// and an IPv6-only cluster still works), ipv4, ipv6, or any (both: a host with A and AAAA
	// records is two endpoints). With auto and any a family whose lookup fails while the other
	// answers keeps its addresses in force.
	Family string `json:"family"`
	// RemoveAfter is how many answers in a row must lack an address before its endpoint is
	// removed (failed lookups do not count). Default 3: a server that answers a random subset
	// of the records (Consul, Route 53 multivalue) does not turn each address that comes back
	// into a new, cold endpoint; 1 removes at the first answer without it.
	RemoveAfter int `json:"remove_after"`
	// MaxEndpoints refuses a set of more endpoints than this (the set in force stays, and the
	// refusal is logged once). Default DefaultMaxEndpoints.
	MaxEndpoints int `json:"max_endpoints"`
	// Endpoint gives every endpoint found the keys of endpoints[] (models, engine, labels,
	// kv_tokens, step_tokens, cache_salt, health_path, metrics_path); url is made from each address.
	Endpoint Endpoint `json:"endpoint"`
}

// DefaultDNSInterval is discovery.dns[].interval's default.
const DefaultDNSInterval = 10 * time.Second

// The address families of discovery.dns[].family.
const (
	FamilyAuto = "auto"
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
	FamilyAny  = "any"
)

// DefaultRemoveAfter is discovery.dns[].remove_after's default.
const DefaultRemoveAfter = 3

// DefaultMaxEndpoints is the default of discovery.dns[].max_endpoints and
// discovery.kubernetes[].max_endpoints: well above a fleet of engines, well below what makes
// the router's health checks, scrapes and metric series a burden of their own.
const DefaultMaxEndpoints = 1024

// URL returns the base URL of the endpoint at addr (an IP address, IPv6 unbracketed).
func (d *DNSDiscovery) URL(addr string) string {
	return d.Scheme + "://" + net.JoinHostPort(addr, strconv.Itoa(d.Port))
}

// Health configures active health checks and passive ejection. A new endpoint starts healthy
// and its first check decides alone; the thresholds apply after that.
type Health struct {
	Interval Duration `json:"interval"` // default 5s
	Timeout  Duration `json:"timeout"`  // default 2s
	// UnhealthyInterval is how often an endpoint whose last check failed is checked instead:
	// one out of rotation comes back within it of its engine answering again (a router started
	// before its engines, an engine restarted), and one in rotation that failed a check meets
	// the next one sooner. Default 1s, or Interval when that is shorter.
	UnhealthyInterval Duration `json:"unhealthy_interval"`
	// HealthyThreshold consecutive successes make an unhealthy endpoint healthy. Default 1.
	HealthyThreshold int `json:"healthy_threshold"`
	// UnhealthyThreshold consecutive failures make a healthy endpoint unhealthy. Default 2.
	UnhealthyThreshold int `json:"unhealthy_threshold"`
	// PassiveFailures consecutive failures while proxying that count against an endpoint
	// (connection errors, 5xx answers, timeouts, lost requests, cut streams) eject it for
	// EjectionTime, twice that at the second ejection in a row, and so on up to
	// MaxEjectionTime. Default 3.
	PassiveFailures int `json:"passive_failures"`
	// EjectionTime is how long a first passive ejection lasts. Default 30s.
	EjectionTime Duration `json:"ejection_time"`
	// MaxEjectionTime caps an ejection's length. Default 5m.
	MaxEjectionTime Duration `json:"max_ejection_time"`
	// MaxEjectedPercent bounds the share of the endpoints passively ejected at once (at
	// least one may be; never the last one). Default 50.
	MaxEjectedPercent int `json:"max_ejected_percent"`
	// The refusal rule: an endpoint that refused (a 4xx other than 429) at least
	// RefusalPercent % of the requests it answered over about the last RefusalWindow, at least
	// RefusalVolume of them, while the rest of the fleet refused at most half as large a share,
	// is ejected as after consecutive failures. Defaults 85, 20 and 1m; a RefusalPercent of -1
	// turns the rule off.
	RefusalPercent int      `json:"refusal_percent"`
	RefusalVolume  int      `json:"refusal_volume"`
	RefusalWindow  Duration `json:"refusal_window"`
	// WarmUp is how long an endpoint that joins a running router (discovery, a scale-up)
	// takes to reach its full share of first choices, so that a new, empty engine does not take
	// every cold prefix at once. Default 20s; "0s" or a negative value turns it off.
	WarmUp *Duration `json:"warm_up"`
}

// WarmUpTime returns health.warm_up (the default when unset, 0 when off).
func (h Health) WarmUpTime() time.Duration {
	if h.WarmUp == nil {
		return 20 * time.Second
	}
	return max(h.WarmUp.D(), 0)
}

// Scrape configures the scraping of engine metrics.
type Scrape struct {
	Interval Duration `json:"interval"` // default 1s
	Timeout  Duration `json:"timeout"`  // default 1s
	// Disabled turns scraping off for every endpoint.
	Disabled bool `json:"disabled"`
}

// Prefix configures prefix blocks.
type Prefix struct {
	// BlockTokens is the tokens per routing block. Default 16.
	BlockTokens int `json:"block_tokens"`
}

// Normalize configures prompt normalisation before hashing.
type Normalize struct {
	// Rewrite sends the normalised prompt to the engine too (else only the hash uses it).
	Rewrite bool `json:"rewrite"`
	// Rules are regular-expression replacements applied in order.
	Rules []Rule `json:"rules"`
}

// Rule is one normalisation rule.
type Rule struct {
	Pattern string `json:"pattern"` // Go regexp syntax
	Replace string `json:"replace"` // $1 expands groups
}

// Limits bounds requests.
type Limits struct {
	MaxBodyBytes int64 `json:"max_body_bytes"` // default 16 MiB
	// MaxRetries is how many other endpoints to try after a failure that makes it safe (no
	// connection, 503 or 429 before any byte, no first token in time): default 2, 0 for none.
	// A pointer so that 0 can be told from unset; read it with Retries.
	MaxRetries *int `json:"max_retries"`
	// ConnectTimeout bounds connecting to an endpoint. Default 5s.
	ConnectTimeout Duration `json:"connect_timeout"`
	// FirstTokenTimeout bounds the wait for a stream's first token, from sending the request;
	// past it the request goes to the next ranked endpoint. Default 2m (long prompts on a busy
	// engine take tens of seconds). endpoints[].first_token_timeout overrides it.
	FirstTokenTimeout Duration `json:"first_token_timeout"`
	// StallTimeout is the shortest wait for a stream's first token after which the attempt
	// is given up as stalled, and the request goes to the next ranked endpoint, when its
	// engine has answered nothing at all meanwhile (no token of any stream, no complete
	// answer, seen by this router or its peers): a hung engine that still passes health
	// checks. The wait is 20 times the attempt's predicted TTFT where that is longer (policies
	// that predict one, prefix-aware), else 20 times its prompt's prefill at the endpoint's
	// learned rate where that is longer (route.Call.Stall). The last attempt a request may
	// make is not watched. Default 10s; as long as first_token_timeout or longer turns it off.
	StallTimeout Duration `json:"stall_timeout"`
	// ResponseTimeout bounds a non-streamed answer, from sending the request to its last byte.
	// Default 10m. endpoints[].response_timeout overrides it.
	ResponseTimeout Duration `json:"response_timeout"`
	// StreamIdleTimeout bounds the silence between two events of a stream; past it the stream
	// ends with an SSE error event. Default 1m.
	StreamIdleTimeout Duration `json:"stream_idle_timeout"`
}

// Retries returns limits.max_retries (the default when unset).
func (l Limits) Retries() int {
	if l.MaxRetries == nil {
		return DefaultMaxRetries
	}
	return *l.MaxRetries
}

// Server holds the HTTP servers' timeouts and limits.
type Server struct {
	ReadHeaderTimeout Duration `json:"read_header_timeout"` // default 10s
	IdleTimeout       Duration `json:"idle_timeout"`        // default 120s
	// WriteTimeout bounds a whole response; default 0 (none: streams may be long).
	WriteTimeout Duration `json:"write_timeout"`
	// ShutdownTimeout bounds the drain of in-flight requests. Default 30s.
	ShutdownTimeout Duration `json:"shutdown_timeout"`
	// DrainDelay is how long, after SIGINT or SIGTERM, the router keeps taking new requests
	// while /readyz answers 503 ("draining"), before it closes the API listener and drains
	// what is in flight (ShutdownTimeout): a load balancer that follows /readyz takes the
	// router out of rotation before its port closes. It applies only once /readyz has been
	// asked since the start (nobody follows it otherwise). Default DefaultDrainDelay (5s); 0:
	// none, the listener closes at the signal.
	DrainDelay *Duration `json:"drain_delay"`
	// BodyReadTimeout bounds reading a request body, from its first read, plus one second for
	// every BodyMinRate bytes received: a body trickled in slowly is cut (408), a large one
	// sent at a fair pace is not. Default 30s.
	BodyReadTimeout Duration `json:"body_read_timeout"`
	// BodyMinRate is the body bytes per second that earn one more second of BodyReadTimeout.
	// Default 65536 (64 KiB/s: a 16 MiB body may take 30 s + 256 s).
	BodyMinRate int64 `json:"body_min_rate"`
	// BodyStallTimeout cuts (408, connection closed) a body that brings less than
	// BodyMinRate bytes (one second's worth) in this long, whatever time BodyReadTimeout and
	// BodyMinRate have granted it: a client that sends most of a large body at once and then
	// stops, or trickles the rest, holds it this long, not minutes. 0: the default,
	// DefaultBodyStallTimeout (10s; BodyStall).
	BodyStallTimeout Duration `json:"body_stall_timeout"`
	// MaxPendingBodyBytes bounds the bytes of the request bodies the API server is receiving
	// at once (read before authentication is settled for tenants' limits, and before any
	// admission). A body beyond it waits up to a second for room, then gets 503 with
	// Retry-After. At least limits.max_body_bytes. 0: the default, DefaultMaxPendingBodyBytes
	// (256 MiB), or a quarter of GOMEMLIMIT when that is lower, never less than
	// limits.max_body_bytes (resolved where the server starts).
	MaxPendingBodyBytes int64 `json:"max_pending_body_bytes"`
	// MaxConnections bounds the API listener's open client connections. At the bound, a new
	// connection closes the longest-idle kept-alive ones (then those that have sent nothing
	// yet) to make room, and is refused (503, closed) only when none waits for a request.
	// 0: derived from the process's open-file limit (RLIMIT_NOFILE, resolved where the
	// server starts): half of what is left once a quarter (at most 256) is kept for files, the
	// admin listener and the listeners, since every proxied request holds a connection to an
	// engine as well; at most 16384.
	MaxConnections int `json:"max_connections"`
	// AdminMaxConnections bounds the admin listener's open connections the same way (the
	// longest-idle and those that have sent nothing yet are closed for a new one; 503 when
	// none waits), so that a flood of connections to it cannot take the open files the API
	// listener needs, and /metrics and /readyz still answer a new connection. 0: the default,
	// DefaultAdminMaxConnections, or less under a low open-file limit (a quarter of what
	// max_connections' default keeps aside, at least 4; resolved where the server starts).
	AdminMaxConnections int `json:"admin_max_connections"`
	// WriteStallTimeout bounds one write to a client: a client that stops reading (a stream
	// included) has its connection closed once a write has waited this long. A stream the
	// client reads is never cut. Default 60s.
	WriteStallTimeout Duration `json:"write_stall_timeout"`
	// HTTPServer picks what serves the API listener: "builtin" (the default), kvroute's own
	// HTTP/1.1 server, which runs each request on its connection's goroutine and costs about
	// 100 µs less per request than Go's; or "net/http", Go's standard server.
	HTTPServer string `json:"http_server"`
	// TLS, when its files are set, serves the API listener over HTTPS.
	TLS TLS `json:"tls"`
	// EndpointHeader, when set, names a response header that carries the URL of the endpoint
	// that served the request (streams included), for clients and benchmarks that measure the
	// spread (kvroute bench reads SuggestedEndpointHeader by default). Empty (the default): off,
	// since it reveals internal addresses.
	EndpointHeader string `json:"endpoint_header"`
}

// TLS is the API listener's certificate: PEM files, relative to the config file's directory.
// Both or neither. The files are read again when they change (a renewed certificate is used
// from the next handshake on).
type TLS struct {
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
}

// Enabled reports whether TLS is configured.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// SuggestedEndpointHeader is the name to give server.endpoint_header; kvroute bench reads it.
const SuggestedEndpointHeader = "X-Kvroute-Endpoint"

// Log configures logging.
type Log struct {
	// Format is json (default) or text; it changes only on restart.
	Format string `json:"format"`
	// Level is debug, info (default), warn or error; a reload puts it in force (and ends a
	// level set at the admin listener's /debug/loglevel).
	Level string `json:"level"`
	// Access turns the access log on or off: one line per request ("request"), nothing else.
	// Default true; a reload puts it in force. Read it with AccessLog.
	Access *bool `json:"access"`
}

// AccessLog returns log.access (the default, true, when unset).
func (l Log) AccessLog() bool { return l.Access == nil || *l.Access }

// Default values.
const (
	DefaultListen         = "127.0.0.1:8080"
	DefaultAdminListen    = "127.0.0.1:9090"
	DefaultPolicy         = "prefix-aware"
	DefaultEngine         = "openai"
	DefaultMaxBodyBytes   = 16 << 20
	DefaultMaxRetries     = 2
	DefaultBlockTokens    = 16
	DefaultMetricsPath    = "/metrics"
	DefaultOverloadQueue  = 1024
	DefaultStallTimeout   = 10 * time.Second
	defaultHealthInterval = 5 * time.Second
)

// Checks are the judgements that Validate cannot make alone, because the knowledge belongs to
// a package that config does not import: which policies exist and which parameters each takes.
// The layer that assembles the application fills them (from the policy package); the zero value
// checks only what config knows by itself.
type Checks struct {
	// PolicyNames are the policies that exist: policy.name must be one of them. Nil: any name.
	PolicyNames []string
	// Policy reports what is wrong with a policy's parameters, given in the text form of
	// Policy.PolicyParams (building the policy is one way to find out). Nil: not checked.
	Policy func(name string, params map[string]string) error
	// ReadSecrets reads the secrets the router will read (auth's with authentication on, the
	// peers' and the one they accept besides; files and environment variables), the variable
	// peers.advertise_env names, and extproc.tls's certificate and key, so that one that does
	// not read, is too short or is not an address to advertise is
	// reported with the other problems rather than after them, when the router starts. False:
	// not read (a config checked away from the machine it runs on, whose files are elsewhere).
	ReadSecrets bool
}

// section is one part of the config: it fills its defaults and checks itself.
type section interface {
	setDefaults(c *Config)
	validate(c *Config, p *problems)
}

// sections lists the config's sections in the order they are checked; checks reach the
// sections that need them.
func (c *Config) sections(checks Checks) []section {
	return []section{
		(*top)(c), policySection{&c.Policy, checks}, endpointList{c}, &c.Discovery, &c.Health, &c.Scrape, &c.Prefix,
		&c.Normalize, &c.Limits, &c.Server, &c.Log, authSection{c}, tenantList{c}, &c.Overload, &c.ExtProc, peersSection{c},
		&c.Autoscale, secretsSection{c, checks.ReadSecrets},
	}
}

// Problem is one thing wrong with a config, as Validate reports it: the key it is about and
// what to do. Its Error is "key: message". A caller that set a key itself (a command-line
// flag) finds the key here, to name its own source instead.
type Problem struct {
	// Key is the path of the key, like endpoints[0].url or log.format.
	Key string
	// Msg says what is wrong and the fix.
	Msg string
}

func (p *Problem) Error() string { return p.Key + ": " + p.Msg }

// Problems returns the Problems in err (Validate's, or Parse's, Load's or LoadWith's, wrapped
// or not), in order; nil when it holds none (a file that does not read or decode).
func Problems(err error) []*Problem {
	var out []*Problem
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *Problem:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// problems collects validation errors, each a Problem.
type problems struct{ errs []error }

func (p *problems) add(path, format string, args ...any) {
	p.errs = append(p.errs, &Problem{Key: path, Msg: fmt.Sprintf(format, args...)})
}

func (p *problems) err() error { return errors.Join(p.errs...) }

// Parse decodes, defaults and validates a config, with no Checks. Relative paths are taken as
// relative to the working directory. The error joins every problem found.
func Parse(data []byte) (*Config, error) {
	return parse(data, "", nil, Checks{})
}

// Load reads, decodes, defaults and validates the config file at path, with no Checks.
// Relative paths in it (discovery.file, auth.secret_file) are relative to the file's directory.
func Load(path string) (*Config, error) { return LoadWith(path, nil, Checks{}) }

// LoadWith is Load with adjust (command-line overrides, nil for none) applied to the decoded
// config before defaults and validation, so that the checks see the values in force, and with
// checks judging what config cannot (see Checks).
func LoadWith(path string, adjust func(*Config), checks Checks) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parseFile(data, path, adjust, checks)
}

// parseFile is parse for the content of the file at path. Relative paths in it are resolved
// against its directory made absolute, so that a message about one of them names the file
// looked for, wherever the router was started.
func parseFile(data []byte, path string, adjust func(*Config), checks Checks) (*Config, error) {
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		dir = filepath.Dir(path)
	}
	c, err := parse(data, dir, adjust, checks)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

func parse(data []byte, dir string, adjust func(*Config), checks Checks) (*Config, error) {
	if empty(data) {
		// Else the one problem reported would be the missing endpoints, as if the rest were there.
		return nil, errors.New("the file is empty (or holds only comments): a config lists endpoints at least, like endpoints: [{url: http://127.0.0.1:8001}]; examples/kvroute.yaml has every key")
	}
	c := &Config{}
	// Unknown keys and mistyped values leave the rest decoded: it is validated too, so that
	// every problem in the file comes back at once.
	derr := decodeStrict(data, c)
	if derr != nil && !decodedRest(derr) {
		if listOfEndpoints(data) {
			// Most likely the file that discovery.file names, given as the config.
			return nil, fmt.Errorf("%w (a list of endpoints is a discovery.file, not a config)", derr)
		}
		return nil, derr
	}
	c.Dir = dir
	if adjust != nil {
		adjust(c)
	}
	unset := enginesUnset(c) // before the defaults fill them
	c.SetDefaults()
	if unset != "" {
		c.Warnings = append(c.Warnings, unset)
	}
	if err := withValidation(derr, c.Validate(checks)); err != nil {
		return nil, err
	}
	return c, nil
}

// enginesUnset is the warning, "" for none, about the endpoints and discovery templates of a
// decoded config that leave engine unset: they are taken for a generic OpenAI API (openai, the
// default), whose metrics are not scraped, so a vLLM or SGLang fleet written that way runs
// without its KV capacity and queue figures (prefix-aware's load signal) and without
// cache_salt. The default stays: an unknown server is not scraped for metrics it lacks. A
// Kubernetes watch that reads the pods' metadata may find the engine there, and is not named.
func enginesUnset(c *Config) string {
	at := endpointsUnset(c.Endpoints)
	for i, n := range c.Discovery.DNS {
		if n.Endpoint.Engine == "" {
			at = append(at, fmt.Sprintf("discovery.dns[%d].endpoint (%s)", i, n.Name))
		}
	}
	for i, k := range c.Discovery.Kubernetes {
		if k.Endpoint.Engine == "" && !k.PodMetadata {
			at = append(at, fmt.Sprintf("discovery.kubernetes[%d].endpoint", i))
		}
	}
	if ip := c.Discovery.InferencePool; ip != nil && ip.Endpoint.Engine == "" {
		at = append(at, "discovery.inference_pool.endpoint")
	}
	return noEngineWarning(at)
}

// endpointsUnset names the endpoints, decoded and not yet defaulted, that leave engine unset:
// endpoints[i] (url).
func endpointsUnset(eps []Endpoint) []string {
	var at []string
	for i, e := range eps {
		if e.Engine == "" {
			at = append(at, fmt.Sprintf("endpoints[%d] (%s)", i, strings.TrimRight(strings.TrimSpace(e.URL), "/")))
		}
	}
	return at
}

// noEngineWarning is the warning about the endpoints and templates at that leave engine unset
// (see enginesUnset); "" when there are none.
func noEngineWarning(at []string) string {
	if len(at) == 0 {
		return ""
	}
	const shown = 5 // a large fleet's list would bury the fix
	if len(at) > shown {
		at = append(at[:shown:shown], fmt.Sprintf("%d more", len(at)-shown))
	}
	kinds := Engines()
	return fmt.Sprintf("%s: no engine, so %s (a generic OpenAI API, the default): no /metrics is read, so the router has no KV capacity or queue figures (what prefix-aware weighs), and no cache_salt is sent; set engine: %s or %s (detected on first contact)",
		strings.Join(at, ", "), DefaultEngine, strings.Join(kinds[:len(kinds)-1], ", "), kinds[len(kinds)-1])
}

// Quick returns the config of a quick start from flags: the endpoints at urls, each serving
// model (empty: any) on engine, and authentication off, said explicitly so that it draws no
// warning. Set what else is wanted, then call SetDefaults and Validate.
func Quick(urls []string, model, engine string) *Config {
	c := &Config{Auth: &Auth{Mode: AuthNone}}
	for _, u := range urls {
		ep := Endpoint{URL: u, Engine: engine}
		if model != "" {
			ep.Models = []string{model}
		}
		c.Endpoints = append(c.Endpoints, ep)
	}
	return c
}

// SetDefaults fills every unset field with its default. It is idempotent.
func (c *Config) SetDefaults() {
	c.Warnings = nil
	for _, s := range c.sections(Checks{}) {
		s.setDefaults(c)
	}
}

// Validate checks the config (after SetDefaults) and returns every problem at once, each naming
// the field path and the fix; checks add the judgements config cannot make alone.
func (c *Config) Validate(checks Checks) error {
	var p problems
	for _, s := range c.sections(checks) {
		s.validate(c, &p)
	}
	return p.err()
}

// Path resolves a path from the config against the config file's directory.
func (c *Config) Path(p string) string {
	if p == "" || filepath.IsAbs(p) || c.Dir == "" {
		return p
	}
	return filepath.Join(c.Dir, p)
}

// top holds the top-level scalar keys.
type top Config

func (t *top) setDefaults(*Config) {
	if t.Listen == "" {
		t.Listen = DefaultListen
	}
	if t.AdminListen == "" {
		t.AdminListen = DefaultAdminListen
	}
}

func (t *top) validate(_ *Config, p *problems) {
	checkAddr(p, "listen", t.Listen)
	checkAddr(p, "admin_listen", t.AdminListen)
	// Port 0 on both is two free ports, not one.
	if _, port, err := net.SplitHostPort(t.Listen); t.Listen == t.AdminListen && err == nil && port != "0" {
		if t.AdminListen == DefaultAdminListen {
			// Most likely listen was moved onto the admin server's default, not the other way.
			p.add("listen", "%q is the admin server's address (admin_listen, default %s): give listen another port, or admin_listen another address", t.Listen, DefaultAdminListen)
		} else {
			p.add("admin_listen", "%q is also listen: give the admin server its own port (default %s)", t.AdminListen, DefaultAdminListen)
		}
	}
}

// checkAddr checks a listen address as net.Listen will read it: host:port, the port a number
// from 0 (any free port) to 65535 or a service name the system knows (http).
func checkAddr(p *problems, path, addr string) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		p.add(path, "%q is not host:port: write it like 127.0.0.1:8080 or :8080", addr)
		return
	}
	if strings.Trim(port, "0123456789") == "" {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			p.add(path, "%q: port %s is not 0 to 65535: write it like 127.0.0.1:8080", addr, port)
		}
		return
	}
	// A service name is looked up in the system's services database (/etc/services), no network.
	if _, err := net.LookupPort("tcp", port); err != nil {
		p.add(path, "%q: port %q is neither a number from 0 to 65535 nor a known service name: write it like 127.0.0.1:8080", addr, port)
	}
}

// policySection is the policy with the checks that judge it.
type policySection struct {
	*Policy
	checks Checks
}

func (s policySection) setDefaults(*Config) {
	if s.Name == "" {
		s.Name = DefaultPolicy
	}
}

func (s policySection) validate(_ *Config, p *problems) {
	if names := s.checks.PolicyNames; names != nil && !slices.Contains(names, s.Name) {
		p.add("policy.name", "unknown policy %q: use one of %s", s.Name, strings.Join(names, ", "))
		return
	}
	params, err := s.PolicyParams()
	if err != nil {
		p.add("policy.params", "%v", err)
		return
	}
	if s.checks.Policy != nil {
		if err := s.checks.Policy(s.Name, params); err != nil {
			p.add("policy.params", "%v", err)
		}
	}
}

// PolicyParams converts the params to the text form policies read (policy.Params).
func (s *Policy) PolicyParams() (map[string]string, error) {
	out := map[string]string{}
	keys := make([]string, 0, len(s.Params))
	for k := range s.Params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var errs []error
	for _, k := range keys {
		switch v := s.Params[k].(type) {
		case string:
			out[k] = v
		case json.Number:
			out[k] = v.String()
		case bool:
			out[k] = fmt.Sprint(v)
		case float64, int, int64:
			out[k] = fmt.Sprint(v)
		default:
			errs = append(errs, fmt.Errorf("%s: got %s, want a single value (text, number or boolean)", k, jsonKind(v)))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

type endpointList struct{ c *Config }

func (l endpointList) setDefaults(*Config) {
	for i := range l.c.Endpoints {
		l.c.Endpoints[i].SetDefaults()
	}
}

func (l endpointList) validate(c *Config, p *problems) {
	if len(c.Endpoints) == 0 && c.Discovery.File == "" && len(c.Discovery.DNS) == 0 && len(c.Discovery.Kubernetes) == 0 && c.Discovery.InferencePool == nil {
		p.add("endpoints", "no endpoints: list at least one (url: http://127.0.0.1:8001), or set discovery.file, discovery.dns, discovery.kubernetes or discovery.inference_pool")
	}
	validateEndpoints(c.Endpoints, "endpoints", p)
}

// SetDefaults fills the endpoint's unset fields.
func (e *Endpoint) SetDefaults() {
	e.URL = strings.TrimRight(strings.TrimSpace(e.URL), "/")
	if e.Engine == "" {
		e.Engine = DefaultEngine
	}
	if e.CacheSalt == nil && e.Engine != "auto" {
		v := e.Engine == "vllm"
		e.CacheSalt = &v
	} // auto: unset, injected once the engine is found to be vLLM (endpoint.Spec.CacheSaltAuto)
	if e.MetricsPath == "" {
		e.MetricsPath = DefaultMetricsPath
	}
}

func validateEndpoints(eps []Endpoint, path string, p *problems) {
	seen := map[string]int{}
	for i, e := range eps {
		at := fmt.Sprintf("%s[%d]", path, i)
		if e.FirstTokenTimeout < 0 {
			p.add(at+".first_token_timeout", "%v: must be positive, like 30s (or absent for limits.first_token_timeout)", e.FirstTokenTimeout.D())
		}
		if e.ResponseTimeout < 0 {
			p.add(at+".response_timeout", "%v: must be positive, like 5m (or absent for limits.response_timeout)", e.ResponseTimeout.D())
		}
		u, err := url.Parse(e.URL)
		switch {
		case e.URL == "":
			p.add(at+".url", "missing: give the engine's base URL, like http://127.0.0.1:8001")
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			p.add(at+".url", "%q is not an http(s) base URL: write it like http://10.0.0.5:8000", e.URL)
		case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
			p.add(at+".url", "%q: remove the query, fragment or user info", e.URL)
		case !validPort(u.Port()):
			p.add(at+".url", "%q: port %q is not a port (1 to 65535)", e.URL, u.Port())
		case strings.HasSuffix(u.Path, "/v1") || strings.Contains(u.Path, "/v1/"):
			p.add(at+".url", "%q: give the base URL without /v1 (the router keeps the client's path)", e.URL)
		}
		// The same engine may be written with a scheme or host in another case.
		key := e.URL
		if err == nil {
			key = strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host) + strings.TrimSuffix(u.Path, "/")
		}
		if j, dup := seen[key]; dup && e.URL != "" {
			p.add(at+".url", "%q is listed twice (also %s[%d]): remove one", e.URL, path, j)
		} else {
			seen[key] = i
		}
		if !slices.Contains(Engines(), e.Engine) {
			p.add(at+".engine", "unknown engine %q: use one of %s", e.Engine, strings.Join(Engines(), ", "))
		}
		for j, m := range e.Models {
			if strings.TrimSpace(m) == "" {
				p.add(fmt.Sprintf("%s.models[%d]", at, j), "empty model name: remove it")
			}
		}
		if e.KVTokens < 0 {
			p.add(at+".kv_tokens", "%d is negative: give the KV capacity in tokens, or 0 to use the scraped value", e.KVTokens)
		}
		if e.StepTokens < 0 {
			p.add(at+".step_tokens", "%d is negative: give the engine's tokens per step under chunked prefill (vLLM max_num_batched_tokens), or 0 for its engine's default or the policy's step_tokens", e.StepTokens)
		}
		for _, f := range []struct{ key, v string }{{"health_path", e.HealthPath}, {"metrics_path", e.MetricsPath}} {
			if f.v != "" && f.v != "-" && !strings.HasPrefix(f.v, "/") {
				p.add(at+"."+f.key, "%q must start with / (or be - for none)", f.v)
			}
		}
	}
}

// endpointFile is the form of a discovery file: a list, or a mapping with an endpoints key.
type endpointFile struct {
	Endpoints []Endpoint `json:"endpoints"`
}

// ParseEndpoints decodes, defaults and validates a discovery file: a YAML list of endpoints
// (the keys of endpoints[] in the config), or a mapping with an endpoints key. As with the
// config, the error joins every problem in the file: unknown keys and mistyped values, each
// left out, and what validating the rest finds.
func ParseEndpoints(data []byte) ([]Endpoint, error) {
	eps, _, err := ParseEndpointsWarn(data)
	return eps, err
}

// ParseEndpointsWarn is ParseEndpoints that also returns the file's warnings, as Load puts the
// config's in Config.Warnings, for its reader to log: the endpoints that leave engine unset,
// taken for a generic OpenAI API and so never scraped, in the words of the config's warning.
// There are none when the file is rejected.
func ParseEndpointsWarn(data []byte) (eps []Endpoint, warnings []string, err error) {
	// A list is decoded as the endpoints key of a mapping (its JSON form, which YAML reads), so
	// that decoding and validation name a problem alike in both forms: endpoints[1].url.
	if js, err := yaml.YAMLToJSONStrict(data); err == nil && documents(data) <= 1 && bytes.HasPrefix(bytes.TrimSpace(js), []byte("[")) {
		data = slices.Concat([]byte(`{"endpoints": `), js, []byte("}"))
	}
	var f endpointFile
	derr := decodeStrict(data, &f)
	if derr != nil && !decodedRest(derr) {
		return nil, nil, derr
	}
	unset := noEngineWarning(endpointsUnset(f.Endpoints)) // before the defaults fill them
	for i := range f.Endpoints {
		f.Endpoints[i].SetDefaults()
	}
	var p problems
	validateEndpoints(f.Endpoints, "endpoints", &p)
	if err := withValidation(derr, p.err()); err != nil {
		return nil, nil, err
	}
	if unset != "" {
		warnings = append(warnings, unset)
	}
	return f.Endpoints, warnings, nil
}

func (d *Discovery) setDefaults(*Config) {
	if d.PollInterval == 0 {
		d.PollInterval = Duration(30 * time.Second)
	}
	for i := range d.DNS {
		n := &d.DNS[i]
		n.Name = strings.TrimSuffix(strings.TrimSpace(n.Name), ".")
		if n.Scheme == "" {
			n.Scheme = "http"
		}
		if n.Interval == 0 {
			n.Interval = Duration(DefaultDNSInterval)
		}
		n.Family = strings.ToLower(strings.TrimSpace(n.Family))
		if n.Family == "" {
			n.Family = FamilyAuto
		}
		if n.RemoveAfter == 0 {
			n.RemoveAfter = DefaultRemoveAfter
		}
		if n.MaxEndpoints == 0 {
			n.MaxEndpoints = DefaultMaxEndpoints
		}
		n.Endpoint.SetDefaults()
	}
	d.setKubernetesDefaults()
	d.setInferencePoolDefaults()
}

func (d *Discovery) validate(_ *Config, p *problems) {
	seen := map[string]int{}
	for i, n := range d.DNS {
		at := fmt.Sprintf("discovery.dns[%d]", i)
		switch {
		case n.Name == "":
			p.add(at+".name", "missing: give the host name to resolve, like vllm.inference.svc.cluster.local")
		case strings.ContainsAny(n.Name, ":/ ") || strings.Contains(n.Name, ".."):
			p.add(at+".name", "%q is not a host name: give the name only (scheme and port have keys of their own)", n.Name)
		}
		if n.Port < 1 || n.Port > 65535 {
			p.add(at+".port", "%d is not a port: give the engines' port, like 8000", n.Port)
		}
		if n.Scheme != "http" && n.Scheme != "https" {
			p.add(at+".scheme", "%q: use http or https", n.Scheme)
		}
		if n.Interval < Duration(time.Second) {
			p.add(at+".interval", "%v is too short: resolve at most once a second, like 10s", n.Interval.D())
		}
		switch n.Family {
		case FamilyAuto, FamilyIPv4, FamilyIPv6, FamilyAny:
		default:
			p.add(at+".family", "%q: use auto (IPv4 addresses when the name has any, else IPv6), ipv4, ipv6 or any (both)", n.Family)
		}
		if n.RemoveAfter < 1 || n.RemoveAfter > 100 {
			p.add(at+".remove_after", "%d: give how many answers in a row must lack an address before its endpoint leaves, from 1 (at once) to 100, like 3", n.RemoveAfter)
		}
		if n.MaxEndpoints < 1 {
			p.add(at+".max_endpoints", "%d: give the most endpoints the name may give, like %d", n.MaxEndpoints, DefaultMaxEndpoints)
		}
		key := n.Scheme + "://" + n.Name + ":" + strconv.Itoa(n.Port)
		if j, dup := seen[key]; dup {
			p.add(at, "%s is listed twice (also discovery.dns[%d]): remove one", key, j)
		} else {
			seen[key] = i
		}
		validateTemplate(at+".endpoint", n.Endpoint, p)
	}
	if d.PollInterval < 0 {
		p.add("discovery.poll_interval", "must be positive, like 30s")
	}
	d.validateKubernetes(p)
	d.validateInferencePool(p)
}

func (h *Health) setDefaults(*Config) {
	if h.Interval == 0 {
		h.Interval = Duration(defaultHealthInterval)
	}
	if h.Timeout == 0 {
		h.Timeout = Duration(2 * time.Second)
	}
	if h.UnhealthyInterval == 0 {
		// From a negative interval, which is reported, it would be reported too, under a key
		// the file does not have.
		h.UnhealthyInterval = Duration(time.Second)
		if h.Interval > 0 {
			h.UnhealthyInterval = min(h.UnhealthyInterval, h.Interval)
		}
	}
	if h.HealthyThreshold == 0 {
		h.HealthyThreshold = 1
	}
	if h.UnhealthyThreshold == 0 {
		h.UnhealthyThreshold = 2
	}
	if h.PassiveFailures == 0 {
		h.PassiveFailures = 3
	}
	if h.EjectionTime == 0 {
		h.EjectionTime = Duration(30 * time.Second)
	}
	if h.MaxEjectionTime == 0 {
		h.MaxEjectionTime = Duration(max(5*time.Minute, h.EjectionTime.D()))
	}
	if h.MaxEjectedPercent == 0 {
		h.MaxEjectedPercent = 50
	}
	if h.RefusalPercent == 0 {
		h.RefusalPercent = 85
	}
	if h.RefusalVolume == 0 {
		h.RefusalVolume = 20
	}
	if h.RefusalWindow == 0 {
		h.RefusalWindow = Duration(time.Minute)
	}
}

func (h *Health) validate(_ *Config, p *problems) {
	if h.EjectionTime < 0 {
		p.add("health.ejection_time", "must be positive, like 30s")
	}
	if h.MaxEjectionTime < h.EjectionTime {
		p.add("health.max_ejection_time", "%v: must be at least health.ejection_time (%v)", h.MaxEjectionTime.D(), h.EjectionTime.D())
	}
	if h.MaxEjectedPercent < 0 || h.MaxEjectedPercent > 100 {
		p.add("health.max_ejected_percent", "%d: must be a percentage from 1 to 100", h.MaxEjectedPercent)
	}
	if h.RefusalPercent != -1 && (h.RefusalPercent < 1 || h.RefusalPercent > 100) {
		p.add("health.refusal_percent", "%d: must be a percentage from 1 to 100, or -1 to turn the refusal rule off", h.RefusalPercent)
	}
	if h.RefusalVolume < 0 {
		p.add("health.refusal_volume", "%d is negative: give the answers an endpoint must have given to be judged, like 20", h.RefusalVolume)
	}
	if h.RefusalWindow < 0 {
		p.add("health.refusal_window", "must be positive, like 1m")
	}
	if h.Interval < 0 {
		p.add("health.interval", "must be positive, like 5s")
	}
	if h.UnhealthyInterval < 0 {
		p.add("health.unhealthy_interval", "must be positive, like 1s")
	} else if h.Interval > 0 && h.UnhealthyInterval > h.Interval {
		p.add("health.unhealthy_interval", "%v is longer than health.interval %v: make it at most that", h.UnhealthyInterval.D(), h.Interval.D())
	}
	if h.Timeout < 0 {
		p.add("health.timeout", "must be positive, like 2s")
	} else if h.Interval > 0 && h.Timeout > h.Interval {
		p.add("health.timeout", "%v is longer than health.interval %v: make it shorter", h.Timeout.D(), h.Interval.D())
	}
	for _, f := range []struct {
		key string
		v   int
	}{{"healthy_threshold", h.HealthyThreshold}, {"unhealthy_threshold", h.UnhealthyThreshold}, {"passive_failures", h.PassiveFailures}} {
		if f.v < 1 {
			p.add("health."+f.key, "%d: must be at least 1", f.v)
		}
	}
}

func (s *Scrape) setDefaults(*Config) {
	if s.Interval == 0 {
		s.Interval = Duration(time.Second)
	}
	if s.Timeout == 0 {
		s.Timeout = Duration(time.Second)
	}
}

func (s *Scrape) validate(_ *Config, p *problems) {
	if s.Interval < 0 {
		p.add("scrape.interval", "must be positive, like 1s")
	}
	if s.Timeout < 0 {
		p.add("scrape.timeout", "must be positive, like 1s")
	}
}

func (x *Prefix) setDefaults(*Config) {
	if x.BlockTokens == 0 {
		x.BlockTokens = DefaultBlockTokens
	}
}

func (x *Prefix) validate(_ *Config, p *problems) {
	if x.BlockTokens < 1 || x.BlockTokens > 1<<16 {
		p.add("prefix.block_tokens", "%d: must be between 1 and 65536 (16 matches vLLM's block size)", x.BlockTokens)
	}
}

func (n *Normalize) setDefaults(*Config) {}

func (n *Normalize) validate(_ *Config, p *problems) {
	for i, r := range n.Rules {
		at := fmt.Sprintf("normalize.rules[%d].pattern", i)
		if r.Pattern == "" {
			p.add(at, "missing: give a Go regular expression")
			continue
		}
		if _, err := regexp.Compile(r.Pattern); err != nil {
			p.add(at, "%q does not compile: %v", r.Pattern, err)
		}
	}
}

// Compile returns the rules' compiled patterns, in order (call after Validate).
func (n *Normalize) Compile() ([]*regexp.Regexp, error) {
	out := make([]*regexp.Regexp, len(n.Rules))
	for i, r := range n.Rules {
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("normalize.rules[%d].pattern: %w", i, err)
		}
		out[i] = re
	}
	return out, nil
}

func (l *Limits) setDefaults(*Config) {
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxRetries == nil {
		n := DefaultMaxRetries
		l.MaxRetries = &n
	}
	for _, d := range []struct {
		v   *Duration
		def time.Duration
	}{{&l.ConnectTimeout, 5 * time.Second}, {&l.FirstTokenTimeout, 2 * time.Minute}, {&l.StallTimeout, DefaultStallTimeout},
		{&l.ResponseTimeout, 10 * time.Minute}, {&l.StreamIdleTimeout, time.Minute}} {
		if *d.v == 0 {
			*d.v = Duration(d.def)
		}
	}
}

func (l *Limits) validate(_ *Config, p *problems) {
	if l.MaxBodyBytes < 1 {
		p.add("limits.max_body_bytes", "%d: must be positive (bytes; default %d)", l.MaxBodyBytes, DefaultMaxBodyBytes)
	}
	if r := l.Retries(); r < 0 || r > 10 {
		p.add("limits.max_retries", "%d: must be between 0 (no retry) and 10", r)
	}
	for _, d := range []struct {
		key string
		v   Duration
	}{{"connect_timeout", l.ConnectTimeout}, {"first_token_timeout", l.FirstTokenTimeout}, {"stall_timeout", l.StallTimeout},
		{"response_timeout", l.ResponseTimeout}, {"stream_idle_timeout", l.StreamIdleTimeout}} {
		if d.v < 0 {
			p.add("limits."+d.key, "%v: must be positive, like 30s", d.v.D())
		}
	}
}

func (s *Server) setDefaults(*Config) {
	if s.ReadHeaderTimeout == 0 {
		s.ReadHeaderTimeout = Duration(10 * time.Second)
	}
	if s.IdleTimeout == 0 {
		s.IdleTimeout = Duration(120 * time.Second)
	}
	if s.ShutdownTimeout == 0 {
		s.ShutdownTimeout = Duration(30 * time.Second)
	}
	if s.DrainDelay == nil {
		d := Duration(DefaultDrainDelay)
		s.DrainDelay = &d
	}
	if s.BodyReadTimeout == 0 {
		s.BodyReadTimeout = Duration(DefaultBodyReadTimeout)
	}
	if s.BodyMinRate == 0 {
		s.BodyMinRate = DefaultBodyMinRate
	}
	if s.WriteStallTimeout == 0 {
		s.WriteStallTimeout = Duration(DefaultWriteStallTimeout)
	}
	if s.HTTPServer == "" {
		s.HTTPServer = HTTPServerBuiltin
	}
}

// Defaults of the client timeouts under server:.
const (
	DefaultBodyReadTimeout     = 30 * time.Second
	DefaultBodyMinRate         = 64 << 10
	DefaultBodyStallTimeout    = 10 * time.Second
	DefaultMaxPendingBodyBytes = 256 << 20
	DefaultWriteStallTimeout   = 60 * time.Second
	DefaultDrainDelay          = 5 * time.Second
)

// DefaultAdminMaxConnections is server.admin_max_connections' default: Prometheus, the
// kubelet's probes and an operator's curl need a few connections, not more.
const DefaultAdminMaxConnections = 64

// Drain returns server.drain_delay (the default when unset).
func (s Server) Drain() time.Duration {
	if s.DrainDelay == nil {
		return DefaultDrainDelay
	}
	return s.DrainDelay.D()
}

// BodyStall returns server.body_stall_timeout (the default when unset).
func (s Server) BodyStall() time.Duration {
	if s.BodyStallTimeout == 0 {
		return DefaultBodyStallTimeout
	}
	return s.BodyStallTimeout.D()
}

// The values of server.http_server.
const (
	HTTPServerBuiltin = "builtin"
	HTTPServerNetHTTP = "net/http"
)

func (s *Server) validate(c *Config, p *problems) {
	if t := s.TLS; t.Enabled() {
		switch {
		case t.CertFile == "":
			p.add("server.tls.cert_file", "missing: give the certificate's PEM file beside key_file")
		case t.KeyFile == "":
			p.add("server.tls.key_file", "missing: give the private key's PEM file beside cert_file")
		default:
			if _, err := tls.LoadX509KeyPair(c.Path(t.CertFile), c.Path(t.KeyFile)); err != nil {
				p.add("server.tls", "cannot load the certificate and key: %v", err)
			}
		}
	}
	for _, f := range []struct {
		key string
		v   Duration
	}{{"read_header_timeout", s.ReadHeaderTimeout}, {"idle_timeout", s.IdleTimeout}, {"write_timeout", s.WriteTimeout}, {"shutdown_timeout", s.ShutdownTimeout},
		{"body_read_timeout", s.BodyReadTimeout}, {"write_stall_timeout", s.WriteStallTimeout}, {"body_stall_timeout", s.BodyStallTimeout}} {
		if f.v < 0 {
			p.add("server."+f.key, "%v is negative: give a duration like 30s", f.v.D())
		}
	}
	if d := s.DrainDelay; d != nil && *d < 0 {
		p.add("server.drain_delay", "%v is negative: give a duration like 5s (0: none)", d.D())
	}
	if s.BodyMinRate < 0 {
		p.add("server.body_min_rate", "%d is negative: give bytes per second (default %d)", s.BodyMinRate, DefaultBodyMinRate)
	}
	switch m := s.MaxPendingBodyBytes; {
	case m < 0:
		p.add("server.max_pending_body_bytes", "%d is negative: give bytes, at least limits.max_body_bytes (0: the default, %d)", m, DefaultMaxPendingBodyBytes)
	case m > 0 && m < c.Limits.MaxBodyBytes:
		p.add("server.max_pending_body_bytes", "%d is less than limits.max_body_bytes (%d): a body of the largest size allowed could never be received; make it at least that", m, c.Limits.MaxBodyBytes)
	}
	if s.MaxConnections < 0 {
		p.add("server.max_connections", "%d is negative: give a number of connections (0: derived from the open-file limit)", s.MaxConnections)
	}
	if s.AdminMaxConnections < 0 {
		p.add("server.admin_max_connections", "%d is negative: give a number of connections, like %d (0: the default)", s.AdminMaxConnections, DefaultAdminMaxConnections)
	}
	if s.HTTPServer != HTTPServerBuiltin && s.HTTPServer != HTTPServerNetHTTP {
		p.add("server.http_server", "%q is not a server: use %s (the default) or %s", s.HTTPServer, HTTPServerBuiltin, HTTPServerNetHTTP)
	}
	if h := s.EndpointHeader; h != "" && strings.TrimLeft(h, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		p.add("server.endpoint_header", "%q is not a header name: use letters, digits and '-', like %s", h, SuggestedEndpointHeader)
	}
}

func (l *Log) setDefaults(*Config) {
	if l.Format == "" {
		l.Format = "json"
	}
	if l.Level == "" {
		l.Level = "info"
	}
	if l.Access == nil {
		on := true
		l.Access = &on
	}
}

func (l *Log) validate(_ *Config, p *problems) {
	if l.Format != "json" && l.Format != "text" {
		p.add("log.format", "%q: use json or text", l.Format)
	}
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		p.add("log.level", "%q: use debug, info, warn or error", l.Level)
	}
}

// validPort reports whether p, a URL's port, is absent or a TCP port number (1 to 65535).
func validPort(p string) bool {
	if p == "" {
		return true
	}
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}
