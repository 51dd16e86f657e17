package app

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/policy"
)

// keepRestartOnly returns a copy of file, a config read for a reload, with the settings that
// change only on restart taken from old, the config in force: listen and admin_listen (the
// listeners stay where they are), discovery (its sources run as they started), extproc,
// server's settings but endpoint_header (the servers run as they started; the drain at the
// end follows their shutdown_timeout and drain_delay), peers' but its secrets (the node runs
// as it started; a reload reads the secrets again), pprof (the admin handler is built at
// start), log.format (the handler is built at start), autoscale.window and
// autoscale.pod_deletion_cost (their collector and writers start with the router). The config
// in force then says what the router does, at this reload and the later ones, and a reload
// that puts the file back as it was changes nothing, and says nothing about them.
func keepRestartOnly(old, file *config.Config) *config.Config {
	c := *file
	c.Listen, c.AdminListen = old.Listen, old.AdminListen
	c.Discovery = old.Discovery
	c.ExtProc = old.ExtProc
	c.Server = old.Server
	c.Server.EndpointHeader = file.Server.EndpointHeader
	c.Peers = keepPeers(old.Peers, file.Peers)
	c.Pprof = old.Pprof
	c.Log.Format = old.Log.Format
	c.Autoscale.Window, c.Autoscale.PodDeletionCost = old.Autoscale.Window, old.Autoscale.PodDeletionCost
	return &c
}

// keepPeers is the peers section in force (old) with the secrets' sources of file's, which a
// reload reads again; old as it is when either has none (a section added or removed takes a
// restart).
func keepPeers(old, file *config.Peers) *config.Peers {
	if old == nil || file == nil {
		return old
	}
	p := *old
	p.SecretFile, p.SecretEnv, p.AcceptSecretFile, p.AcceptSecretEnv = file.SecretFile, file.SecretEnv, file.AcceptSecretFile, file.AcceptSecretEnv
	return &p
}

// serverChanges names the server settings that change only on restart (all but
// endpoint_header) whose value in file, a config read for a reload, is not the one in force
// (old).
func serverChanges(old, file config.Server) []string {
	var keys []string
	add := func(changed bool, key string) {
		if changed {
			keys = append(keys, "server."+key)
		}
	}
	add(old.ReadHeaderTimeout != file.ReadHeaderTimeout, "read_header_timeout")
	add(old.IdleTimeout != file.IdleTimeout, "idle_timeout")
	add(old.WriteTimeout != file.WriteTimeout, "write_timeout")
	add(old.ShutdownTimeout != file.ShutdownTimeout, "shutdown_timeout")
	add(old.Drain() != file.Drain(), "drain_delay")
	add(old.BodyReadTimeout != file.BodyReadTimeout, "body_read_timeout")
	add(old.BodyMinRate != file.BodyMinRate, "body_min_rate")
	add(old.BodyStallTimeout != file.BodyStallTimeout, "body_stall_timeout")
	add(old.MaxPendingBodyBytes != file.MaxPendingBodyBytes, "max_pending_body_bytes")
	add(old.MaxConnections != file.MaxConnections, "max_connections")
	add(old.AdminMaxConnections != file.AdminMaxConnections, "admin_max_connections")
	add(old.WriteStallTimeout != file.WriteStallTimeout, "write_stall_timeout")
	add(old.HTTPServer != file.HTTPServer, "http_server")
	add(old.TLS != file.TLS, "tls")
	return keys
}

// otherRestartChanges names pprof, log.format, autoscale.window and
// autoscale.pod_deletion_cost where file, a config read for a reload, differs from the config
// in force (old).
func otherRestartChanges(old, file *config.Config) []string {
	var keys []string
	if old.Pprof != file.Pprof {
		keys = append(keys, "pprof")
	}
	if old.Log.Format != file.Log.Format {
		keys = append(keys, "log.format")
	}
	if old.Autoscale.Window != file.Autoscale.Window {
		keys = append(keys, "autoscale.window")
	}
	if !reflect.DeepEqual(old.Autoscale.PodDeletionCost, file.Autoscale.PodDeletionCost) {
		keys = append(keys, "autoscale.pod_deletion_cost")
	}
	return keys
}

// secretSum is the digest of the tenants' salt secret cfg gives (auth.secret_file or
// auth.secret_env), zero with authentication off or a secret that cannot be read (the gate
// then rejects the config): a reload compares it to tell that every salt changed.
func secretSum(cfg *config.Config) [sha256.Size]byte {
	if cfg.AuthMode() != config.AuthAPIKey {
		return [sha256.Size]byte{}
	}
	secret, err := cfg.Secret(nil)
	if err != nil {
		return [sha256.Size]byte{}
	}
	return sha256.Sum256(secret)
}

// logSecretChange says what a change of the tenants' salt secret did, once a reload applied it
// (the config watcher sees the file change before the reload, which may reject it).
func logSecretChange(logger *slog.Logger, old, cur [sha256.Size]byte, cfg *config.Config) {
	var zero [sha256.Size]byte
	if old == cur || old == zero || cur == zero {
		return // unchanged, or no salts before or after: authentication was turned on or off
	}
	effect := "every tenant's cache salt changes"
	for _, ref := range cfg.Refs() {
		if ref.Key == "auth.secret_file" && ref.Effect != "" {
			effect = ref.Effect
		}
	}
	logger.Warn("the tenants' salt secret changed", "effect", effect)
}

// tenantDiff is what a reload changed in the tenants, by name (each list sorted); it never
// holds a key.
type tenantDiff struct {
	added, removed []string
	// rekeyed are the tenants kept whose API keys changed, keysAdded and keysRemoved the keys
	// added and removed over all tenants (a key moved from one tenant to another counts in
	// both).
	rekeyed                []string
	keysAdded, keysRemoved int
	// limited are the tenants kept whose limits changed, limits the limits that changed
	// (tenants[].limits' keys) over all of them.
	limited, limits []string
	// other are the tenants kept whose other settings changed (priority, models,
	// endpoint_labels, allow_fields).
	other []string
}

func (d tenantDiff) empty() bool {
	return len(d.added)+len(d.removed)+len(d.rekeyed)+len(d.limited)+len(d.other) == 0
}

// tenantChanges compares the tenants of two configs by name.
func tenantChanges(old, cur []config.Tenant) tenantDiff {
	var d tenantDiff
	keys := func(t config.Tenant) map[string]bool {
		ks := make(map[string]bool, len(t.APIKeys))
		for _, k := range t.APIKeys {
			ks[k] = true
		}
		return ks
	}
	before := make(map[string]config.Tenant, len(old))
	for _, t := range old {
		before[t.Name] = t
	}
	after := make(map[string]bool, len(cur))
	limits := map[string]bool{}
	for _, t := range cur {
		after[t.Name] = true
		prev, ok := before[t.Name]
		if !ok {
			d.added = append(d.added, t.Name)
			d.keysAdded += len(keys(t))
			continue
		}
		ks, pks := keys(t), keys(prev)
		in, out := 0, 0
		for k := range ks {
			if !pks[k] {
				in++
			}
		}
		for k := range pks {
			if !ks[k] {
				out++
			}
		}
		if in+out > 0 {
			d.rekeyed = append(d.rekeyed, t.Name)
			d.keysAdded, d.keysRemoved = d.keysAdded+in, d.keysRemoved+out
		}
		if ch := limitChanges(prev.Limits, t.Limits); len(ch) > 0 {
			d.limited = append(d.limited, t.Name)
			for _, k := range ch {
				limits[k] = true
			}
		}
		if prev.Priority != t.Priority || !slices.Equal(prev.Models, t.Models) ||
			!maps.Equal(prev.EndpointLabels, t.EndpointLabels) || !slices.Equal(prev.AllowFields, t.AllowFields) {
			d.other = append(d.other, t.Name)
		}
	}
	for _, t := range old {
		if !after[t.Name] {
			d.removed = append(d.removed, t.Name)
			d.keysRemoved += len(keys(t))
		}
	}
	d.limits = slices.Sorted(maps.Keys(limits))
	for _, l := range []*[]string{&d.added, &d.removed, &d.rekeyed, &d.limited, &d.other} {
		slices.Sort(*l)
		*l = slices.Compact(*l) // names are unique in a config that validated
	}
	return d
}

// limitChanges names the limits (tenants[].limits' keys) that old and cur set differently.
func limitChanges(old, cur config.TenantLimits) []string {
	var keys []string
	add := func(changed bool, key string) {
		if changed {
			keys = append(keys, key)
		}
	}
	add(old.RequestsPerMinute != cur.RequestsPerMinute, "requests_per_minute")
	add(old.TokensPerMinute != cur.TokensPerMinute, "tokens_per_minute")
	add(old.MaxConcurrent != cur.MaxConcurrent, "max_concurrent")
	add(old.MaxOutputTokens != cur.MaxOutputTokens, "max_output_tokens")
	return keys
}

// maxTenantNames bounds the names of each list a tenants changed line shows: a reload that
// adds a thousand tenants says how many, not every name.
const maxTenantNames = 10

// shownNames is names as a tenants changed line shows them: the first maxTenantNames, and
// "+N more" for the rest (a name is letters, digits, '.', '_' and '-': never that).
func shownNames(names []string) []string {
	if len(names) <= maxTenantNames {
		return names
	}
	return append(slices.Clip(names[:maxTenantNames]), fmt.Sprintf("+%d more", len(names)-maxTenantNames))
}

// logTenantChanges logs what a reload changed in the tenants, by name, as the endpoints that
// changed are: those added, removed, given other keys (with the count of keys added and
// removed), other limits (with the limits that changed) or other settings; each list only
// where it has a name, and at most maxTenantNames names of it. Names and counts, never a key.
// Before, a reload that changed only a tenant's limits said nothing of it.
func logTenantChanges(logger *slog.Logger, old, cur *config.Config) {
	d := tenantChanges(old.Tenants, cur.Tenants)
	if d.empty() {
		return
	}
	var attrs []any
	names := func(key string, names []string) {
		if len(names) > 0 {
			attrs = append(attrs, key, shownNames(names))
		}
	}
	names("added", d.added)
	names("removed", d.removed)
	names("keys_changed", d.rekeyed)
	if d.keysAdded+d.keysRemoved > 0 {
		attrs = append(attrs, "keys_added", d.keysAdded, "keys_removed", d.keysRemoved)
	}
	names("limits_changed", d.limited)
	if len(d.limits) > 0 {
		attrs = append(attrs, "limits", d.limits)
	}
	names("settings_changed", d.other)
	attrs = append(attrs, "tenants", len(cur.Tenants))
	logger.Info("tenants changed", attrs...)
}

// policyChangedLocked hands what old, the picker in force (built from was's policy section),
// learned to picker, the one built for cfg (params: its parameters), where the policy can take
// it (policy.Inheritor: prefix-aware, cache-aware, overlap-cost and scorer-weighted given other
// parameters; an index whose sizes changed is resized where it is, in steps, while old routes
// on), and says what was kept, or what is lost: a reload that changed a parameter used to
// start the policy empty, its index and calibration gone (a soak test's index went from 47,258
// entries to 314, and every endpoint's prefill rate back to the 10,000 tokens/s prior), and
// said only "policy rebuilt". The caller holds r.mu; picker has not been used yet.
func (r *Router) policyChangedLocked(old, picker policy.Picker, was, cfg *config.Config, params policy.Params) {
	oldParams, _ := was.Policy.PolicyParams() // in force: it read when it applied
	same := was.Policy.Name == cfg.Policy.Name
	if inh, ok := picker.(policy.Inheritor); ok && same {
		if in, ok := inh.Inherit(old, oldParams, params); ok {
			r.logger.Info("policy parameters changed: what the policy learned is kept", "policy", cfg.Policy.Name,
				"changed", paramChanges(oldParams, params), "index_entries", in.IndexEntries, "index_resized", in.IndexResized, "index_evicted", in.IndexEvicted,
				"endpoints", in.Endpoints, "endpoints_calibrated", in.Calibrated, "fleet_calibrated", in.FleetCalibrated)
			return
		}
	}
	attrs := []any{"policy", cfg.Policy.Name}
	if same {
		attrs = append(attrs, "changed", paramChanges(oldParams, params))
	} else {
		attrs = append(attrs, "policy_before", was.Policy.Name)
	}
	sizer, indexed := old.(policy.IndexSizer)
	_, learns := old.(policy.Inheritor)
	if !indexed && !learns {
		r.logger.Info("policy rebuilt", attrs...) // the old one learned nothing to lose
		return
	}
	if indexed {
		n, _ := sizer.IndexSize()
		attrs = append(attrs, "index_entries_dropped", n)
	}
	msg := "policy rebuilt: what the old one learned is dropped, the new one starts empty"
	if r.peers != nil {
		msg += " (the peer replicas' snapshot is taken only at start: what they placed before is learned again as requests come)"
	}
	r.logger.Warn(msg, attrs...)
}

// paramChanges names the policy parameters that old and cur set differently (one set and the
// other not included), sorted.
func paramChanges(old, cur policy.Params) []string {
	var keys []string
	for _, k := range slices.Sorted(maps.Keys(old)) {
		if v, ok := cur[k]; !ok || v != old[k] {
			keys = append(keys, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(cur)) {
		if _, ok := old[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
