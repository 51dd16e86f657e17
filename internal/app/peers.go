package app

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery/kube"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/peer"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/version"
)

// peers is the router's side of replica sync (config peers:): the node that talks to the
// other replicas and the share every lifecycle of this router publishes to and applies on.
type peers struct {
	node    *peer.Node
	share   *route.Share
	kube    *peer.Kube        // peers.kubernetes's watch, run beside the node; nil without it
	secrets [sha256.Size]byte // of the secrets in force (secretsSum)
}

// secretsSum fingerprints the secrets in force, to tell a reload that changed them.
func secretsSum(secret, accept []byte) [sha256.Size]byte {
	h := sha256.New()
	h.Write(secret)
	h.Write([]byte{0})
	h.Write(accept)
	return [sha256.Size]byte(h.Sum(nil))
}

// newPeers builds the replica sync of cfg.Peers; nil without it. It binds the event stream
// listener but starts nothing: Run does.
func (r *Router) newPeers(cfg *config.Config) (*peers, error) {
	pc := cfg.Peers
	if pc == nil {
		return nil, nil
	}
	secret, err := cfg.PeerSecret(nil)
	if err != nil {
		return nil, err
	}
	accept, err := cfg.PeerAcceptSecret(nil)
	if err != nil {
		return nil, err
	}
	// peers.advertise, or the variable advertise_env names, read again here: a config loaded
	// without reading this machine's variables (Checks.ReadSecrets) is checked now.
	advertise, err := cfg.PeerAdvertise(nil)
	if err != nil {
		return nil, err
	}
	var sources []peer.Source
	if len(pc.Static) > 0 {
		sources = append(sources, peer.Static(pc.Static))
	}
	if pc.DNS != nil {
		sources = append(sources, peer.DNS{Name: pc.DNS.Name, Port: pc.DNS.Port})
	}
	kube, err := peer.KubeFromConfig(cfg, version.UserAgent(), r.logger)
	if err != nil {
		return nil, err
	}
	if kube != nil {
		kube.OnError = func(error) { r.metrics.DiscoveryErrors.WithLabelValues(kube.String()).Inc() }
		sources = append(sources, kube)
	}
	var serverTLS, clientTLS *tls.Config
	if t := pc.TLS; t != nil {
		certs, err := (&certFiles{field: "peers.tls", certPath: cfg.Path(t.CertFile), keyPath: cfg.Path(t.KeyFile), every: certCheckEvery, log: r.logger}).start()
		if err != nil {
			return nil, err
		}
		roots, err := config.CertPool(cfg.Path(t.CAFile))
		if err != nil {
			return nil, fmt.Errorf("peers.tls.ca_file: %w", err)
		}
		serverTLS, clientTLS = peer.MutualTLS(func() (*tls.Certificate, error) { return certs.get(nil) }, roots, t.ServerName)
	}
	// peers.tenant_limits fleet: the gate enforces each tenant's limits divided among the
	// replicas alive, told as membership changes.
	var replicas func(int)
	if pc.TenantLimits != config.TenantLimitsReplica && r.gate != nil {
		replicas = r.gate.SetReplicas
	}
	node, err := peer.New(peer.Config{
		Name: pc.Name, Listen: pc.Listen, Gossip: pc.GossipListen, Advertise: advertise, Sources: sources, Secret: secret, Accept: accept,
		BatchInterval: pc.BatchInterval.D(), MaxMessageBytes: pc.MaxMessageBytes, Queue: pc.Queue,
		WarmStartTimeout: pc.WarmStartTimeout.D(), SnapshotMaxBytes: pc.SnapshotMaxBytes, RejoinInterval: pc.RejoinInterval.D(),
		FaultInjection: pc.FaultInjection, Logger: r.logger, Metrics: metrics.NewPeers(r.reg),
		ServerTLS: serverTLS, ClientTLS: clientTLS, Replicas: replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	p := &peers{node: node, kube: kube, secrets: secretsSum(secret, accept)}
	p.share = route.NewShare(route.ShareConfig{
		Self: node.Origin(), Out: node, Endpoint: r.pool.ByName,
		MaxRemote: pc.MaxRemoteRequests, TTL: pc.RequestTTL.D(),
		OnPeerStall: func(ep *endpoint.Endpoint, silent time.Duration) {
			r.logger.Warn("a peer replica found the engine stalled: it goes after the other endpoints here too, but for a request every 30 s, until it answers",
				"endpoint", ep.Name, "silent_for", silent.Round(time.Millisecond).String())
		},
	})
	node.Attach(p.share, func() *route.Lifecycle { return r.h.Load().Lifecycle }, r.pool.All)
	r.logger.Info("router replica: sharing with peers", "name", node.Name(), "listen", node.Addr().String(), "gossip", pc.GossipListen,
		"tls", pc.TLS != nil, "tenant_limits", pc.TenantLimits)
	return p, nil
}

// shared is the Share of this router's lifecycles; nil without peers.
func (p *peers) shared() *route.Share {
	if p == nil {
		return nil
	}
	return p.share
}

// run runs the node, and the Kubernetes watch that finds its peers if there is one (through
// client when not nil: tests give a fake), until ctx ends (nothing without peers).
func (p *peers) run(ctx context.Context, client kube.Client) error {
	if p == nil {
		return nil
	}
	if p.kube == nil {
		return p.node.Run(ctx)
	}
	if client != nil {
		p.kube.Watch.Client = client
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan error, 1)
	go func() { watched <- p.kube.Run(ctx) }()
	err := p.node.Run(ctx)
	cancel() // the node may stop first, on an error
	if werr := <-watched; !errors.Is(werr, context.Canceled) {
		err = errors.Join(err, werr)
	}
	return err
}

// ready reports whether the warm start is over (always, without peers).
func (p *peers) ready() bool { return p == nil || p.node.Ready() }

// admin adds /debug/peers (and the fault injection switch when configured) to mux.
func (p *peers) admin(mux *http.ServeMux) {
	if p != nil {
		p.node.AdminRoutes(mux)
	}
}

// reloaded applies the peers secrets of cfg, the config a reload put in force, anew (a
// rotation: docs/replicas.md, "Rotating the secret"), read again even when their files or
// variables keep their names; the rest of the section changes only on restart (cfg keeps
// old's, keepRestartOnly), which it warns of while file, the config read, differs from it.
func (p *peers) reloaded(r *Router, old, file, cfg *config.Config) {
	if !reflect.DeepEqual(withoutSecrets(old.Peers), withoutSecrets(file.Peers)) {
		r.logger.Warn("the peers section changes only on restart (its secrets excepted)")
	}
	if p == nil || cfg.Peers == nil {
		return
	}
	secret, accept, err := p.readSecrets(cfg)
	if err != nil {
		// checked by Router.apply; read again since, and gone meanwhile
		r.logger.Warn("the peers secrets cannot be read: this replica goes on with those in force, but would not start again", "err", err)
		return
	}
	sum := secretsSum(secret, accept)
	if sum == p.secrets {
		return
	}
	if err := p.node.SetSecrets(secret, accept); err != nil {
		r.logger.Warn("the peers secrets were not changed", "err", err)
		return
	}
	p.secrets = sum
}

// readSecrets reads cfg's peers secrets: the one to send with and the one accepted besides
// (nil for none). A config whose secrets do not read (gone, too short) is rejected at a reload
// (Router.apply), as one whose salt secret does not: the config in force keeps its own.
func (p *peers) readSecrets(cfg *config.Config) (secret, accept []byte, err error) {
	if p == nil || cfg.Peers == nil {
		return nil, nil, nil
	}
	secret, err = cfg.PeerSecret(nil)
	accept, err2 := cfg.PeerAcceptSecret(nil)
	return secret, accept, errors.Join(err, err2)
}

// withoutSecrets is a peers section less its secrets' sources; nil for nil.
func withoutSecrets(pc *config.Peers) *config.Peers {
	if pc == nil {
		return nil
	}
	c := *pc
	c.SecretFile, c.SecretEnv, c.AcceptSecretFile, c.AcceptSecretEnv = "", "", "", ""
	return &c
}
