package realengine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/gguf"
	"github.com/kvroute/kvroute/internal/workload"
)

// The engine's settings (see the issue and docs/fidelity.md): four cached sequences per
// instance, prefix sharing across them, the Go engine (llama.cpp's runner aborts on a shared
// slot: "seq_cp() is only supported for full KV buffers"), flash attention (without it cold
// prefills slow down as the cache fills), debug logs (the only place ollama says what it
// reused), no pruning of the shared model folder at start.
const (
	numParallel = 4
	modelName   = "tiny"
)

// modelfile is ollama's recipe for the model: a plain chat template whose words are in the
// vocabulary, one CPU thread (so three instances and the router fit on two cores), greedy
// sampling, and a context long enough for the workload's prompts.
const modelfile = `FROM ./tiny.gguf
TEMPLATE """{{- range .Messages }}<|{{ .Role }}|>
{{ .Content }}
{{ end }}<|assistant|>
"""
PARAMETER num_ctx 4096
PARAMETER num_thread 1
PARAMETER temperature 0
`

// ollamaBinary returns $KVROUTE_OLLAMA, or skips the test with what to do.
func ollamaBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("KVROUTE_OLLAMA")
	if bin == "" {
		t.Skip("KVROUTE_OLLAMA is not set: the real-engine suite needs an ollama binary; build it with " +
			"KVROUTE_OLLAMA=$(bash scripts/ollama.sh) (or run make realengine)")
	}
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		t.Fatalf("KVROUTE_OLLAMA=%s is not an executable file (%v)", bin, err)
	}
	return bin
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// proc is a child process in its own process group (ollama starts a runner process per loaded
// model: stopping the group stops it too), with its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// start runs bin with args and env (added to a minimal environment), output to logPath. The
// process group is stopped when the test ends, if it has not been before.
func start(t *testing.T, name, bin string, env []string, logPath string, args ...string) *proc {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop interrupts the process group, and kills it after 15 s.
func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	pgid := p.cmd.Process.Pid // Setpgid: the group's id is the leader's pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Logf("%s did not stop after SIGTERM: killing its process group", p.name)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// A runner that outlived its server (it should not) is killed by its pid: once the leader
	// is reaped, its pid (the group's id) may name someone else's group.
	for _, pid := range groupMembers(pgid) {
		t.Logf("%s left process %d behind: killing it", p.name, pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// groupMembers lists the processes whose process group is pgid (from /proc).
func groupMembers(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// After the parenthesised command name: state, ppid, pgrp.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitHTTP polls url until it answers 200, the process dies, or the deadline passes.
func waitHTTP(t *testing.T, p *proc, url string, within time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(within); ; {
		resp, err := client.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if p.exited() {
			t.Fatalf("%s exited (%v) before %s answered; log %s:\n%s", p.name, p.err, url, p.log, tail(p.log, 2000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not answer 200 within %v (last error %v); log:\n%s", p.name, url, within, err, tail(p.log, 2000))
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}

// tail returns the last n bytes of a file, for failure messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(b[max(0, len(b)-n):])
}

// fleet is where the engines' files live: the model store shared by every instance and a
// HOME of their own (ollama writes its key there).
type fleet struct {
	bin, dir, models, home string
}

// newFleet writes the tiny model and `ollama create`s it in a fresh model store.
func newFleet(t *testing.T, bin, dir string) *fleet {
	t.Helper()
	f := &fleet{bin: bin, dir: dir, models: filepath.Join(dir, "models"), home: filepath.Join(dir, "home")}
	modelDir := filepath.Join(dir, "model")
	for _, d := range []string{f.models, f.home, modelDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	vocab, err := gguf.NewVocab(append(workload.Words(), "user", "assistant", "system"))
	if err != nil {
		t.Fatal(err)
	}
	model, err := gguf.Llama(gguf.DefaultLlama(), vocab)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(modelDir, "tiny.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := model.WriteTo(out); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(modelDir, "Modelfile"), []byte(modelfile), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	srv := f.start(t, port, filepath.Join(dir, "create-serve.log"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	create := exec.CommandContext(ctx, bin, "create", modelName, "-f", "Modelfile")
	create.Dir = modelDir
	create.Env = append(f.env(port), "PATH="+os.Getenv("PATH"))
	if b, err := create.CombinedOutput(); err != nil {
		t.Fatalf("ollama create: %v\n%s", err, b)
	}
	srv.stop(t)
	return f
}

// env is an instance's environment.
func (f *fleet) env(port int) []string {
	return []string{
		"HOME=" + f.home,
		"OLLAMA_HOST=127.0.0.1:" + strconv.Itoa(port),
		"OLLAMA_MODELS=" + f.models,
		"OLLAMA_NUM_PARALLEL=" + strconv.Itoa(numParallel),
		"OLLAMA_MULTIUSER_CACHE=1",
		"OLLAMA_NEW_ENGINE=1",
		"OLLAMA_FLASH_ATTENTION=1",
		"OLLAMA_KEEP_ALIVE=-1",
		"OLLAMA_MAX_LOADED_MODELS=1",
		"OLLAMA_NOPRUNE=1",
		"OLLAMA_DEBUG=1",
	}
}

// start runs `ollama serve` on port and waits until it answers.
func (f *fleet) start(t *testing.T, port int, logPath string) *proc {
	t.Helper()
	p := start(t, fmt.Sprintf("ollama :%d", port), f.bin, f.env(port), logPath, "serve")
	waitHTTP(t, p, fmt.Sprintf("http://127.0.0.1:%d/api/version", port), time.Minute)
	return p
}

// slot is one "loading cache slot" line of ollama's debug log: a request's prompt length and
// how much of it was reused from the slot's cache, in engine tokens.
type slot struct{ prompt, used int }

var slotLine = regexp.MustCompile(`msg="loading cache slot".* prompt=(\d+) used=(\d+)`)

// readSlots returns the slot lines of an ollama log, in order.
func readSlots(path string) ([]slot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []slot
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		m := slotLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		p, err1 := strconv.Atoi(m[1])
		u, err2 := strconv.Atoi(m[2])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, sc.Text(), err)
		}
		out = append(out, slot{p, u})
	}
	return out, sc.Err()
}

// slotsAtLeast returns the slot lines of an ollama log once there are at least n, or what there
// is after 10 s. The runner's lines reach the server's log through a pipe the server copies
// from, so a request's line may land a moment after its response: counting right after a
// response can miss it.
func slotsAtLeast(t *testing.T, path string, n int) []slot {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := readSlots(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(s) >= n || time.Now().After(deadline) {
			return s
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

// hits sums slot lines: requests that reused at least half their prompt (a shared system
// prompt found), and the reused and prompt tokens.
func hits(slots []slot) (n, used, prompt int) {
	for _, s := range slots {
		if 2*s.used >= s.prompt {
			n++
		}
		used += s.used
		prompt += s.prompt
	}
	return n, used, prompt
}

// mentions reports whether a log file contains s.
func mentions(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}

func mkdir(dir string) error { return os.MkdirAll(dir, 0o755) }
