package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	oldSecret = "0123456789abcdef0123456789abcdef"
	newSecret = "fedcba9876543210fedcba9876543210"
	keyDigest = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
)

// TestConfigRefs: the files a reload reads again, resolved against the config's directory; a
// salt secret only with authentication on, none for secrets in variables.
func TestConfigRefs(t *testing.T) {
	tenants := "tenants: [{name: a, api_keys: [" + keyDigest + "]}]\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string // key=path
	}{
		{name: "none", yaml: minimal},
		{name: "salt and peers", yaml: minimal + tenants + "auth: {secret_file: salt}\n" +
			"peers: {listen: '127.0.0.1:7947', secret_file: /run/peers/s, accept_secret_file: next}\n",
			want: []string{"auth.secret_file=/etc/kvroute/salt", "peers.secret_file=/run/peers/s", "peers.accept_secret_file=/etc/kvroute/next"}},
		{name: "salt unused without authentication", yaml: minimal + "auth: {mode: none, secret_file: salt}\n"},
		{name: "variables", yaml: minimal + tenants + "auth: {secret_env: SALT}\npeers: {listen: '127.0.0.1:7947', secret_env: SECRET, accept_secret_env: NEXT}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseFile([]byte(tc.yaml), "/etc/kvroute/kvroute.yaml", nil, Checks{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range c.Refs() {
				got = append(got, r.Key+"="+r.Path)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Refs (-want +got):\n%s", diff)
			}
		})
	}
}

// writeFile writes data to path in place.
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startRefWatcher writes the config text to dir/kvroute.yaml and runs a Watcher on it from the
// config it loads, as kvroute serve does.
func startRefWatcher(t *testing.T, dir, yaml string) (w *Watcher, path string, configs <-chan *Config, rejected <-chan error) {
	t.Helper()
	path = filepath.Join(dir, "kvroute.yaml")
	writeFile(t, path, yaml)
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	w = &Watcher{Path: path, Initial: []byte(yaml), Config: c, InitialRefs: ReadRefs(c.Refs())}
	configs, rejected = startWatcher(t, w)
	return w, path, configs, rejected
}

// waitWatched waits until Run watches the referenced files want (it starts in the background).
func waitWatched(t *testing.T, w *Watcher, want ...string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := w.watched()
		if cmp.Equal(want, got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("watched %q, want %q", got, want)
		}
	}
}

func peerSecretOf(t *testing.T, c *Config) string {
	t.Helper()
	s, err := c.PeerSecret(nil)
	if err != nil {
		t.Fatal(err)
	}
	return string(s)
}

// TestWatcher_RefChangeReloads: a change of the peers' secret file alone, written beside the
// config, in another directory, or swapped in as Kubernetes updates a Secret's volume (a
// symlink to a new directory renamed over the old one), reloads the config, and Apply's config
// reads the new secret; the config file itself is unchanged.
func TestWatcher_RefChangeReloads(t *testing.T) {
	for _, tc := range []string{"same directory", "other directory", "kubernetes swap"} {
		t.Run(tc, func(t *testing.T) {
			dir := t.TempDir()
			secretDir := dir
			if tc != "same directory" {
				secretDir = t.TempDir()
			}
			secret := filepath.Join(secretDir, "peer-secret")
			// update puts s in force as the case does.
			update := func(gen int, s string) {
				if tc != "kubernetes swap" {
					replace(t, secret, s)
					return
				}
				ts := filepath.Join(secretDir, fmt.Sprintf("..2026_12_07_%d", gen))
				if err := os.Mkdir(ts, 0o700); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(ts, "peer-secret"), s)
				tmp := filepath.Join(secretDir, "..data_tmp")
				if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, filepath.Join(secretDir, "..data")); err != nil {
					t.Fatal(err)
				}
				if gen > 0 {
					if err := os.RemoveAll(filepath.Join(secretDir, fmt.Sprintf("..2026_12_07_%d", gen-1))); err != nil {
						t.Fatal(err)
					}
				}
			}
			update(0, oldSecret)
			if tc == "kubernetes swap" {
				if err := os.Symlink("..data/peer-secret", secret); err != nil {
					t.Fatal(err)
				}
			}
			yaml := minimal + fmt.Sprintf("peers: {listen: '127.0.0.1:7947', secret_file: %q}\n", secret)
			w, _, configs, errs := startRefWatcher(t, dir, yaml)
			waitWatched(t, w, secret)

			update(1, newSecret+"\n")
			if got := peerSecretOf(t, recvConfig(t, configs)); got != newSecret {
				t.Errorf("secret after the change %q, want %q", got, newSecret)
			}
			if len(errs) > 0 {
				t.Errorf("rejected: %v", <-errs)
			}
		})
	}
}

// TestWatcher_RefsFollowConfig: a config that refers to other files has those watched in place
// of the old ones, before it is applied; a change of one of them reloads.
func TestWatcher_RefsFollowConfig(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	a, b, salt := filepath.Join(dir, "a"), filepath.Join(other, "b"), filepath.Join(other, "salt")
	writeFile(t, a, oldSecret)
	writeFile(t, b, oldSecret)
	writeFile(t, salt, oldSecret)
	peers := func(secret string) string {
		return fmt.Sprintf("peers: {listen: '127.0.0.1:7947', secret_file: %q}\n", secret)
	}
	w, path, configs, _ := startRefWatcher(t, dir, minimal+peers("a"))
	waitWatched(t, w, a)

	replace(t, path, minimal+peers(b)+"tenants: [{name: t, api_keys: ["+keyDigest+"]}]\nauth: {secret_file: ../"+filepath.Base(other)+"/salt}\n")
	recvConfig(t, configs)
	if diff := cmp.Diff([]string{salt, b}, w.watched()); diff != "" {
		t.Errorf("watched after the config changed (-want +got):\n%s", diff)
	}

	replace(t, b, newSecret)
	if got := peerSecretOf(t, recvConfig(t, configs)); got != newSecret {
		t.Errorf("secret after b changed %q, want %q", got, newSecret)
	}
	replace(t, salt, newSecret)
	c := recvConfig(t, configs)
	if s, err := c.Secret(nil); err != nil || string(s) != newSecret {
		t.Errorf("salt secret after it changed %q (%v), want %q", s, err, newSecret)
	}
}

// TestWatcher_RefVanishes: a referenced file that goes missing is rejected with its key and
// nothing is applied (the config in force keeps what it read); when it comes back changed, the
// config is reloaded with it.
func TestWatcher_RefVanishes(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "peer-secret")
	writeFile(t, secret, oldSecret)
	_, _, configs, errs := startRefWatcher(t, dir, minimal+fmt.Sprintf("peers: {listen: '127.0.0.1:7947', secret_file: %q}\n", secret))

	if err := os.Remove(secret); err != nil {
		t.Fatal(err)
	}
	err := recvErr(t, errs)
	if !strings.Contains(err.Error(), "peers.secret_file") || !strings.Contains(err.Error(), secret) {
		t.Errorf("error = %v, want the key and the file", err)
	}
	if len(configs) > 0 {
		t.Fatalf("a config was applied without its secret: %+v", <-configs)
	}

	replace(t, secret, newSecret)
	if got := peerSecretOf(t, recvConfig(t, configs)); got != newSecret {
		t.Errorf("secret after it came back %q, want %q", got, newSecret)
	}
}

// TestWatcher_UnwatchableDir: a config file whose directory cannot be watched ends Run with the
// error, even while its context goes on.
func TestWatcher_UnwatchableDir(t *testing.T) {
	w := &Watcher{Path: filepath.Join(t.TempDir(), "gone", "kvroute.yaml"), Initial: []byte(minimal),
		Apply: func(c *Config) { t.Errorf("applied %+v", c) }}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "gone") {
			t.Errorf("Run: %v, want the directory's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s")
	}
}

// TestWatcher_RefBackUnchanged: a referenced file that cannot be read for a while (deleted, a
// directory in its place, its mode 000) is rejected with its key and nothing is applied; when it
// comes back the config is reloaded, with the content in force as with a new one, so that a
// reload that applies ends the rejection (kvroute_config_last_reload_successful back to 1).
// Before, a file back with the content in force reloaded nothing, and the rejection stayed.
func TestWatcher_RefBackUnchanged(t *testing.T) {
	for _, how := range []string{"deleted", "a directory in its place", "mode 000"} {
		t.Run(how, func(t *testing.T) {
			if how == "mode 000" && os.Geteuid() == 0 {
				t.Skip("root reads a file whatever its mode")
			}
			secret := filepath.Join(t.TempDir(), "salt")
			writeFile(t, secret, oldSecret)
			yaml := minimal + "tenants: [{name: a, api_keys: [" + keyDigest + "]}]\n" + fmt.Sprintf("auth: {secret_file: %q}\n", secret)
			w, _, configs, errs := startRefWatcher(t, t.TempDir(), yaml)
			waitWatched(t, w, secret)
			hide := func() {
				switch how {
				case "deleted":
					if err := os.Remove(secret); err != nil {
						t.Fatal(err)
					}
				case "a directory in its place":
					if err := os.Remove(secret); err != nil {
						t.Fatal(err)
					}
					if err := os.Mkdir(secret, 0o700); err != nil {
						t.Fatal(err)
					}
				default:
					if err := os.Chmod(secret, 0); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, content := range []string{oldSecret, newSecret} {
				hide()
				if err := recvErr(t, errs); !strings.Contains(err.Error(), "auth.secret_file") {
					t.Errorf("error = %v, want the key", err)
				}
				if len(configs) > 0 {
					t.Fatalf("a config was applied without its secret: %+v", <-configs)
				}
				if how == "a directory in its place" {
					if err := os.Remove(secret); err != nil {
						t.Fatal(err)
					}
				}
				replace(t, secret, content)
				c := recvConfig(t, configs)
				if s, err := c.Secret(nil); err != nil || string(s) != content {
					t.Errorf("salt secret once back %q (%v), want %q", s, err, content)
				}
			}
			if len(errs) > 0 {
				t.Errorf("rejected once back: %v", <-errs)
			}
		})
	}
}
