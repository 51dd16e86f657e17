package config

import "os"

// Ref is a file a config refers to whose content is read again at every reload, besides the
// config file itself: a Watcher watches it too.
type Ref struct {
	// Key is the config key that names the file, like peers.secret_file.
	Key string
	// Path is the file, resolved against the config file's directory.
	Path string
	// Effect, when set, is what a change of the file does beyond the obvious, for the log of
	// the reload that applies it.
	Effect string
}

// Refs returns the files whose content a reload of c reads again: the tenants' salt secret
// (auth.secret_file, with authentication on: it is read only then), the replicas' secret and
// the one they accept besides (peers.secret_file, peers.accept_secret_file). TLS certificates
// and keys are not among them: the router re-reads those itself when they change, and
// discovery.file is followed by its discovery source. Secrets in environment variables cannot
// change under a running process.
func (c *Config) Refs() []Ref {
	var refs []Ref
	if c.AuthMode() == AuthAPIKey && c.Auth.SecretFile != "" {
		refs = append(refs, Ref{Key: "auth.secret_file", Path: c.Path(c.Auth.SecretFile),
			Effect: "every tenant's cache salt changes: what the engines cached under the old salts is no longer reused"})
	}
	if p := c.Peers; p != nil {
		if p.SecretFile != "" {
			refs = append(refs, Ref{Key: "peers.secret_file", Path: c.Path(p.SecretFile)})
		}
		if p.AcceptSecretFile != "" {
			refs = append(refs, Ref{Key: "peers.accept_secret_file", Path: c.Path(p.AcceptSecretFile)})
		}
	}
	return refs
}

// ReadRefs reads the files refs name, by path; a file that cannot be read is left out. A
// Watcher compares what it reads later with this, to tell a change.
func ReadRefs(refs []Ref) map[string][]byte {
	m := make(map[string][]byte, len(refs))
	for _, r := range refs {
		if data, err := os.ReadFile(r.Path); err == nil {
			m[r.Path] = data
		}
	}
	return m
}
