package helm

import (
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/config"
)

// shutdownMargin is what a pod's grace period keeps beyond the preStop sleep, kvroute's drain
// delay and its drain: a second for the cut requests' last words (internal/app's cutGrace), one
// for the admin server's shutdown, one for the exit.
const shutdownMargin = 3 * time.Second

// The Kubernetes defaults of a probe's fields left out.
const (
	defaultPeriodSeconds    = 10
	defaultFailureThreshold = 3
)

// shutdown is how a rendered pod stops, from its Deployment and its config as kvroute reads it
// (defaults included).
type shutdown struct {
	sleep    time.Duration // the preStop sleep (0: none)
	drain    time.Duration // server.drain_delay
	drains   bool          // kvroute waits the delay out: there is one, and the readiness probe asks /readyz
	timeout  time.Duration // server.shutdown_timeout
	grace    time.Duration // terminationGracePeriodSeconds
	probeFor time.Duration // periodSeconds x failureThreshold: the longest the probe takes to see /readyz fail
}

func shutdownOf(t *testing.T, m *manifests) shutdown {
	t.Helper()
	// Decoded and defaulted, not validated: the tests that render files the pod mounts (peers'
	// TLS) cannot load them here; kvrouteConfig judges the whole config where it can.
	var c config.Config
	if err := yaml.UnmarshalStrict([]byte(m.configMap.Data["kvroute.yaml"]), &c); err != nil {
		t.Fatalf("the rendered config does not decode: %v", err)
	}
	c.SetDefaults()
	spec := m.deployment.Spec.Template.Spec
	ctr := spec.Containers[0]
	s := shutdown{drain: c.Server.Drain(), timeout: c.Server.ShutdownTimeout.D()}
	if h := ctr.Lifecycle; h != nil && h.PreStop != nil {
		if h.PreStop.Sleep == nil {
			t.Errorf("preStop %+v: want a sleep (the image has no shell)", h.PreStop)
		} else {
			s.sleep = time.Duration(h.PreStop.Sleep.Seconds) * time.Second
		}
	}
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		s.grace = time.Duration(*g) * time.Second
	} else {
		s.grace = 30 * time.Second // Kubernetes' default
	}
	if p := ctr.ReadinessProbe; p != nil && p.HTTPGet != nil && p.HTTPGet.Path == "/readyz" {
		s.drains = s.drain > 0
		period, failures := p.PeriodSeconds, p.FailureThreshold
		if period == 0 {
			period = defaultPeriodSeconds
		}
		if failures == 0 {
			failures = defaultFailureThreshold
		}
		s.probeFor = time.Duration(period*failures) * time.Second
	}
	return s
}

// need is the longest the pod takes to stop once Kubernetes decides to stop it.
func (s shutdown) need() time.Duration {
	d := s.sleep + s.timeout + shutdownMargin
	if s.drains {
		d += s.drain
	}
	return d
}

// checkShutdown holds a rendered pod to the order of its shutdown (docs/operations.md,
// "Starting and stopping"): Kubernetes kills it no sooner than the preStop sleep, the drain
// delay and the drain take; the readiness probe sees /readyz fail, and the pod's endpoints
// follow (a second), within the drain delay, while the listeners still take requests; a
// preStop sleep keeps the pod serving wherever a listener closes at SIGTERM: where kvroute
// skips the delay. The ext_proc listener waits the same delay as the API listener
// (internal/extproc: server.drain_delay where readiness was asked, /readyz included).
func checkShutdown(t *testing.T, m *manifests) {
	t.Helper()
	s := shutdownOf(t, m)
	if s.grace < s.need() {
		t.Errorf("terminationGracePeriodSeconds %v: shorter than the shutdown, %v (sleep %v, drain delay %v waited out %v, drain %v, margin %v)",
			s.grace, s.need(), s.sleep, s.drain, s.drains, s.timeout, shutdownMargin)
	}
	if s.drains && s.probeFor+time.Second > s.drain {
		t.Errorf("readiness probe: %v to see /readyz fail and a second for the endpoints, longer than the drain delay %v", s.probeFor, s.drain)
	}
	if !s.drains && s.sleep == 0 {
		t.Errorf("no preStop sleep, though the listeners close at SIGTERM (the drain delay is skipped)")
	}
}

// TestChartShutdown: the pod's grace period, readiness probe and preStop sleep fit the drain
// of the config the chart renders, a preStop sleep only where a listener would close before
// the pod's endpoints have followed.
func TestChartShutdown(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		sleep        time.Duration
		need         time.Duration
	}{
		// kvroute's drain delay keeps the API listener open: no sleep; 5 + 30 + 3 s.
		{"defaults", "", 0, 38 * time.Second},
		// The ext_proc listener takes new streams for the drain delay too, the probe asking
		// /readyz: no sleep either; 5 + 30 + 3 s.
		{"endpoint picker", "mode: endpointPicker", 0, 38 * time.Second},
		// Without a delay to wait out, it closes at SIGTERM: a sleep first; 5 + 30 + 3 s.
		{"endpoint picker without drain delay", "mode: endpointPicker\nconfig: {server: {drain_delay: 0s}}", 5 * time.Second, 38 * time.Second},
		{"endpoint picker probed elsewhere", "mode: endpointPicker\nreadinessProbe: {httpGet: {path: /healthz, port: admin}}", 5 * time.Second, 38 * time.Second},
		// No delay, the API listener closes at SIGTERM.
		{"no drain delay", "config: {server: {drain_delay: 0s}}", 5 * time.Second, 38 * time.Second},
		// A probe that does not ask /readyz: kvroute skips the delay.
		{"probe elsewhere", "readinessProbe: {httpGet: {path: /healthz, port: admin}, periodSeconds: 5}", 5 * time.Second, 38 * time.Second},
		{"longer drain", "config: {server: {drain_delay: 10s, shutdown_timeout: 2m}}\nterminationGracePeriodSeconds: 133\nreadinessProbe: {httpGet: {path: /readyz, port: admin}, periodSeconds: 3, failureThreshold: 3}",
			0, 133 * time.Second},
		{"durations in parts", "config: {server: {drain_delay: 5500ms, shutdown_timeout: 1m0.5s}}\nterminationGracePeriodSeconds: 69", 0, 69 * time.Second},
		{"a sleep given", "preStopSleepSeconds: 7\nterminationGracePeriodSeconds: 45", 7 * time.Second, 45 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := render(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			s := shutdownOf(t, decodeAll(t, out)) // decodeAll runs checkShutdown
			if s.sleep != tc.sleep || s.need() != tc.need {
				t.Errorf("preStop sleep %v, shutdown %v; want %v and %v", s.sleep, s.need(), tc.sleep, tc.need)
			}
		})
	}
}

// TestChartRefusesAShutdownThatDoesNotFit: a values change that breaks the relation between the
// grace period, the readiness probe and the drain is refused, with the least that fits.
func TestChartRefusesAShutdownThatDoesNotFit(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"config: {server: {shutdown_timeout: 60s}}", "terminationGracePeriodSeconds: 45 is shorter than a pod's shutdown: preStop sleep 0 s + config.server.drain_delay 5 s (waited out) + config.server.shutdown_timeout 60 s + 3 s (the cut requests' last second, the admin server's, the exit) = 68 s: raise it to 68"},
		{"terminationGracePeriodSeconds: 37", "= 38 s: raise it to 38"},
		{"mode: endpointPicker\nterminationGracePeriodSeconds: 37", "preStop sleep 0 s + config.server.drain_delay 5 s (waited out) + config.server.shutdown_timeout 30 s + 3 s (the cut requests' last second, the admin server's, the exit) = 38 s: raise it to 38"},
		{"mode: endpointPicker\npreStopSleepSeconds: 5\nterminationGracePeriodSeconds: 42", "preStop sleep 5 s + config.server.drain_delay 5 s (waited out) + config.server.shutdown_timeout 30 s + 3 s (the cut requests' last second, the admin server's, the exit) = 43 s: raise it to 43"},
		{"preStopSleepSeconds: 10", "= 48 s: raise it to 48"},
		{"config: {server: {drain_delay: 20s}}\nreadinessProbe: {httpGet: {path: /readyz, port: admin}, periodSeconds: 2, failureThreshold: 2}", "= 53 s: raise it to 53"},
		{"config: {server: {shutdown_timeout: 1.5s}}\nterminationGracePeriodSeconds: 9", "= 9.5 s: raise it to 10"},
		// The chart's probe before: 10 s to see /readyz fail, the listener closed after 5.
		{"readinessProbe: {httpGet: {path: /readyz, port: admin}, periodSeconds: 5, failureThreshold: 2}",
			"readinessProbe: periodSeconds 5 x failureThreshold 2: the probe may take 10 s to see /readyz fail at SIGTERM, and the pod's endpoints a second to follow, longer than config.server.drain_delay (5 s), after which kvroute closes its API listener: make periodSeconds x failureThreshold at most 4, or raise config.server.drain_delay to 11s"},
		// Left to Kubernetes' defaults (null removes the chart's).
		{"readinessProbe: {periodSeconds: null, failureThreshold: null}", "periodSeconds 10 x failureThreshold 3: the probe may take 30 s"},
		{"config: {server: {drain_delay: 1500ms}}", "longer than config.server.drain_delay (1.5 s), after which kvroute closes its API listener: raise config.server.drain_delay to 5s"},
		{"config: {server: {drain_delay: 5}}", `config.server.drain_delay: "5" is not a duration: write it like 5s, 1m30s or 500ms`},
		{"config: {server: {shutdown_timeout: -1s}}", `config.server.shutdown_timeout: "-1s" is not a duration`},
	} {
		_, err := render(t, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: %v, want an error saying %q", tc.values, err, tc.want)
		}
	}
}

// TestChartNeedsTheSleepAction: the preStop sleep action is on by default from Kubernetes 1.30
// (beta); a 1.29 API server without its feature gate drops it, leaving a preStop hook without
// a handler, which it refuses. The chart says so before that.
func TestChartNeedsTheSleepAction(t *testing.T) {
	_, err := helm(t, "template", "llm", "kvroute", "--namespace", "serving", "--kube-version", "1.29.9", "--set", "mode=endpointPicker")
	if want := "chart requires kubeVersion: >=1.30.0-0"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("helm template for Kubernetes 1.29: %v, want an error saying %q", err, want)
	}
}
