package simserver

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/suggest"
)

// DefaultProfile is the engine profile used when Options.Profile is empty.
const DefaultProfile = "llama3-70b-h200-tp8"

// DefaultModel is the served model name used when Options.Model is empty.
const DefaultModel = "meta-llama/Llama-3.1-70B-Instruct"

// Options configure one simulated instance (StartFleet gives each instance of a fleet the same
// options, with its own KV-event ports).
type Options struct {
	// Profile names the engine profile (engine.Profiles); "" means DefaultProfile.
	Profile string
	// Model is the served model name that requests must ask for; "" means DefaultModel.
	Model string
	// TimeScale is wall seconds per model second: 0.1 runs ten times faster than the profile.
	// 0 means 1. Every reported duration (metrics, logs) stays in model time.
	TimeScale float64
	// Seed makes the generated text (and fault draws) reproducible.
	Seed uint64
	// BlockSize and KVBlocks override the profile's KV block size (tokens) and block count.
	BlockSize, KVBlocks int
	// MaxModelLen bounds prompt + output tokens (0 means 131072, Llama 3.1's context).
	MaxModelLen int
	// DefaultMaxTokens is the output length when the request gives no max_tokens (0 means 256).
	DefaultMaxTokens int
	// StreamInterval is the least wall time between two writes of a stream (0 means 10 ms;
	// negative: write every step). Each token still gets its own chunk; when steps are shorter
	// than this (fast time scales), several chunks go out in one write, which keeps hundreds of
	// streams affordable. The instance's driver wakes all its streams with new tokens together
	// (at the first step end after each interval), so no stream needs a timer of its own and
	// HTTP/2 streams sharing a connection are written in one go. The first token and the end
	// of a stream are always written at once.
	StreamInterval time.Duration
	// KVEvents, when set, is the ZMQ PUB endpoint of KV events, e.g. "tcp://127.0.0.1:5557"
	// (port 0: a free port). KVEventsReplay, when set, is the ROUTER replay endpoint.
	KVEvents, KVEventsReplay string
	// KVTopic is the topic frame of KV events; "" means "kv@<instance name>@<model>".
	KVTopic string
	// Name identifies the instance in logs and the KV topic ("" means "sim").
	Name string
	// Admin serves GET/POST /admin/faults.
	Admin bool
	// Faults is the initial fault state (see Instance.SetFaults to change it).
	Faults Faults
	// Now gives the timestamps clients see ("created", KV-event ts); nil means time.Now. The
	// engine is paced by the real clock whatever Now says.
	Now func() time.Time
	// Logger receives request logs (never prompt text); nil discards them.
	Logger *slog.Logger
}

// Faults make an instance misbehave, for testing a router's failover. The zero value is a
// healthy instance.
type Faults struct {
	// Unhealthy makes GET /health answer 503.
	Unhealthy bool `json:"unhealthy"`
	// Refuse closes every API connection without an answer (as a crashed server would).
	Refuse bool `json:"refuse"`
	// FailRate is the fraction (0..1) of API requests answered with FailStatus at once.
	FailRate float64 `json:"fail_rate"`
	// FailStatus is the status of failed requests: 500 or 503 (0 means 503).
	FailStatus int `json:"fail_status"`
	// Slow stretches every engine step by this factor (0 or 1: normal speed); model-time
	// durations grow with it, as on a throttled GPU.
	Slow float64 `json:"slow"`
	// CutAfter, when > 0, cuts every stream (closes the connection without [DONE]) after this
	// many tokens; a non-streaming request is cut before its answer.
	CutAfter int `json:"cut_after"`
	// Hang makes the API accept requests and never answer them, while /health and /metrics
	// answer as usual: an engine whose scheduler is stuck. A hung request is held until its
	// client leaves, the instance closes or the fault is cleared (it then runs as usual, as a
	// process does after SIGCONT).
	Hang bool `json:"hang"`
	// DropOn, when not empty, makes a request whose body contains it drop its connection once
	// the body is read, without an answer: an engine that crashes on a query of death.
	DropOn string `json:"drop_on"`
	// DropAll makes such a request drop every API request in flight on the instance too, as a
	// crash would; the instance serves new requests at once (it restarted).
	DropAll bool `json:"drop_all"`
	// NoPrefixCache makes the engine find nothing cached for any prompt and report
	// cached_tokens 0, as an engine with prefix caching off, or one whose cache keys differ
	// from the router's (another salt, tokenizer or block size), silently does: what the
	// router's cache audit exists to notice.
	NoPrefixCache bool `json:"no_prefix_cache"`
}

// faultFields lists the JSON fields of Faults, for the error that refuses any other: from the
// struct, so that a new fault cannot be left out.
func faultFields() string {
	t := reflect.TypeFor[Faults]()
	names := make([]string, t.NumField())
	for i := range names {
		names[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return strings.Join(names, ", ")
}

// maxDropOn bounds DropOn (it is searched for in every request body).
const maxDropOn = 1024

// An OptionError is a bad value of one field of Options. Its message names the field as this
// package's users know it (the words of Options' doc; a fault's JSON name, as POST
// /admin/faults takes it); Field is the field as Go spells it ("TimeScale", "Faults.FailRate"
// for a fault), so that a command can name the flag that set it instead (kvroute sim does).
type OptionError struct {
	Field string
	Name  string // "time scale", "fail_rate"
	Value string // the value refused, as the message shows it
	Msg   string // what is wrong, and the fix: "want a positive factor (0.1 runs ten times faster)"
}

func (e *OptionError) Error() string { return e.Name + " " + e.Value + ": " + e.Msg }

// optionErr is the OptionError of field, called name, for value (printed with %v).
func optionErr(field, name string, value any, msg string) error {
	return &OptionError{Field: field, Name: name, Value: fmt.Sprint(value), Msg: msg}
}

// Validate returns every problem of f at once.
func (f Faults) Validate() error {
	var errs []error
	if f.FailRate < 0 || f.FailRate > 1 || math.IsNaN(f.FailRate) {
		errs = append(errs, optionErr("Faults.FailRate", "fail_rate", f.FailRate, "want a fraction in [0, 1]"))
	}
	if f.FailStatus != 0 && (f.FailStatus < 400 || f.FailStatus > 599) {
		errs = append(errs, optionErr("Faults.FailStatus", "fail_status", f.FailStatus, "want an HTTP error status from 400 to 599, such as 500 or 503"))
	}
	if f.Slow < 0 || f.Slow > 0 && f.Slow < 1 || math.IsNaN(f.Slow) || math.IsInf(f.Slow, 0) {
		errs = append(errs, optionErr("Faults.Slow", "slow", f.Slow, "want a factor >= 1 (0 for none)"))
	}
	if f.CutAfter < 0 {
		errs = append(errs, optionErr("Faults.CutAfter", "cut_after", f.CutAfter, "want a token count >= 0 (0 for none)"))
	}
	if len(f.DropOn) > maxDropOn {
		errs = append(errs, optionErr("Faults.DropOn", "drop_on", fmt.Sprintf("(%d bytes)", len(f.DropOn)), fmt.Sprintf("want at most %d bytes", maxDropOn)))
	}
	if f.DropAll && f.DropOn == "" {
		errs = append(errs, errors.New("drop_all without drop_on: set the text that makes the instance crash"))
	}
	return errors.Join(errs...)
}

func (f Faults) status() int {
	if f.FailStatus == 0 {
		return http.StatusServiceUnavailable
	}
	return f.FailStatus
}

func (f Faults) slow() float64 {
	if f.Slow <= 0 {
		return 1
	}
	return f.Slow
}

func (o Options) withDefaults() Options {
	if o.Profile == "" {
		o.Profile = DefaultProfile
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.TimeScale == 0 {
		o.TimeScale = 1
	}
	if o.MaxModelLen == 0 {
		o.MaxModelLen = 131072
	}
	if o.DefaultMaxTokens == 0 {
		o.DefaultMaxTokens = 256
	}
	if o.StreamInterval == 0 {
		o.StreamInterval = 10 * time.Millisecond
	}
	if o.Name == "" {
		o.Name = "sim"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// validate returns every problem of o (defaults applied) at once: each field's as an
// OptionError.
func (o Options) validate() error {
	var errs []error
	if o.TimeScale < 0 || math.IsNaN(o.TimeScale) || math.IsInf(o.TimeScale, 0) {
		errs = append(errs, optionErr("TimeScale", "time scale", o.TimeScale, "want a positive factor (0.1 runs ten times faster)"))
	}
	if _, err := engine.LookupProfile(o.Profile); err != nil {
		errs = append(errs, profileError(o.Profile))
	}
	if o.BlockSize < 0 {
		errs = append(errs, optionErr("BlockSize", "block size", o.BlockSize, "want a positive token count (0: the profile's)"))
	}
	if o.KVBlocks < 0 {
		errs = append(errs, optionErr("KVBlocks", "kv blocks", o.KVBlocks, "want a positive block count (0: the profile's)"))
	}
	if o.MaxModelLen < 0 {
		errs = append(errs, optionErr("MaxModelLen", "max model len", o.MaxModelLen, "want a positive token count"))
	}
	if o.DefaultMaxTokens < 0 {
		errs = append(errs, optionErr("DefaultMaxTokens", "default max tokens", o.DefaultMaxTokens, "want a positive token count"))
	}
	// The publisher takes these schemes (kvevents); said here, before anything listens, rather
	// than by each instance as it starts.
	for _, ep := range []struct{ field, name, v string }{
		{"KVEvents", "kv events endpoint", o.KVEvents},
		{"KVEventsReplay", "kv events replay endpoint", o.KVEventsReplay},
	} {
		if ep.v != "" && !publisherScheme(ep.v) {
			errs = append(errs, optionErr(ep.field, ep.name, strconv.Quote(ep.v), "want tcp://HOST:PORT (or ipc://, inproc://)"))
		}
	}
	if o.KVEventsReplay != "" && o.KVEvents == "" {
		errs = append(errs, errors.New("kv events replay endpoint without a kv events endpoint: set both"))
	}
	if err := o.Faults.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("faults: %w", err))
	}
	return errors.Join(errs...)
}

// publisherScheme reports whether endpoint has a scheme the KV-event publisher binds.
func publisherScheme(endpoint string) bool {
	for _, scheme := range []string{"tcp://", "ipc://", "inproc://"} {
		if strings.HasPrefix(endpoint, scheme) {
			return true
		}
	}
	return false
}

// profileError refuses an unknown profile name, with the nearest known one when a name is
// near and the list of them.
func profileError(name string) error {
	var names []string
	for _, p := range engine.Profiles() {
		names = append(names, p.Name)
	}
	msg := "unknown profile"
	if near := suggest.Nearest(name, names); near != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", near)
	}
	return optionErr("Profile", "profile", name, msg+": use one of "+strings.Join(names, ", "))
}
