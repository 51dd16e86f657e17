package extproc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/route"

	"github.com/prometheus/client_golang/prometheus"
)

// memStream is an ext_proc stream in memory: Recv hands out the messages in turn, then io.EOF.
type memStream struct {
	grpc.ServerStream // nil: only Recv, Send and Context are used
	ctx               context.Context
	in                []*extprocv3.ProcessingRequest
	out               []*extprocv3.ProcessingResponse
}

func (m *memStream) Context() context.Context { return m.ctx }

func (m *memStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(m.in) == 0 {
		return nil, io.EOF
	}
	r := m.in[0]
	m.in = m.in[1:]
	return r, nil
}

func (m *memStream) Send(r *extprocv3.ProcessingResponse) error {
	m.out = append(m.out, r)
	return nil
}

// messages decodes fuzz input into what a gateway could send: the filter's body modes, then
// messages, each an opcode, flags and a payload (a body chunk, a path or a status).
func messages(data []byte) []*extprocv3.ProcessingRequest {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	modes := []filterv3.ProcessingMode_BodySendMode{fullDuplex, buffered, streamed, noBody, filterv3.ProcessingMode_BUFFERED_PARTIAL}
	cfg := &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[int(next())%len(modes)], ResponseBodyMode: modes[int(next())%len(modes)]}
	var out []*extprocv3.ProcessingRequest
	for len(data) > 0 && len(out) < 32 {
		op, flags := next(), next()
		n := min(int(next()), len(data))
		payload := string(data[:n])
		data = data[n:]
		eos := flags&1 != 0
		var m *extprocv3.ProcessingRequest
		switch op % 8 {
		case 0:
			path := "/v1/chat/completions"
			switch flags >> 4 % 4 {
			case 1:
				path = "/v1/completions"
			case 2:
				path = payload
			case 3:
				path = "/v1/models"
			}
			m = reqHeaders(path, eos)
		case 1:
			m = reqBody(payload, eos)
		case 2:
			m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
		case 3:
			ct := "application/json"
			if flags&4 != 0 {
				ct = "text/event-stream"
			}
			served := ""
			if flags&8 != 0 {
				served = "10.0.0.2:8000"
				if len(payload) > 0 && payload[0]&1 != 0 {
					served = "10.9.9.9:8000" // not on the list: Envoy's fallback
				}
			}
			// The payload is Envoy's attempt count, as it came; its second byte, Envoy's response
			// flags (its own answer: UH, UT, UR, UF, UC, UO...).
			m = respHeaders(200+int(flags>>4)*25, served, eos, "content-type", ct, "x-envoy-attempt-count", payload)
			if len(payload) > 1 {
				withAttributes(m, map[string]*structpb.Value{"response.flags": structpb.NewNumberValue(float64(payload[1]))})
			}
		case 4:
			m = respBody(payload, eos)
		case 5:
			m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}
		case 6:
			m = &extprocv3.ProcessingRequest{}
		case 7:
			m = withSubset(reqHeaders("/v1/chat/completions", eos), "10.0.0.2:8000")
		}
		if flags&2 != 0 && m.MetadataContext == nil {
			// Protobuf strings are UTF-8 on the wire; a gateway cannot send other bytes.
			m = withSubset(m, "10.0.0.1:8000", strings.ToValidUTF8(payload, "?"))
		}
		out = append(out, m)
	}
	if len(out) > 0 {
		out[0].ProtocolConfig = cfg
	}
	return out
}

// encode is the inverse of messages for the seeds: modes, then (op, flags, payload) triples.
func encode(reqMode, respMode byte, msgs ...any) []byte {
	b := []byte{reqMode, respMode}
	for i := 0; i+2 < len(msgs); i += 3 {
		p := msgs[i+2].(string)
		b = append(b, byte(msgs[i].(int)), byte(msgs[i+1].(int)), byte(len(p)))
		b = append(b, p...)
	}
	return b
}

// FuzzProcess feeds arbitrary sequences of ext_proc messages to the picker: it must answer or
// end the stream, never panic or hang, and leave no request counted on an endpoint nor one the
// policy was told of and not told the end of; nothing is sent after an immediate response.
func FuzzProcess(f *testing.F) {
	f.Add(encode(0, 0, 0, 0, "", 1, 0, `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`[:30],
		1, 1, `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`[30:],
		3, 4|8, "", 4, 0, event1, 4, 1, usageEvent+doneEvent))
	f.Add(encode(1, 1, 0, 0, "", 1, 1, plainChat, 3, 0, "", 4, 1, jsonAnswer))
	f.Add(encode(0, 2, 7, 0, "", 1, 0, plainChat, 2, 0, "", 3, 0, "", 4, 0, "{", 5, 0, ""))
	f.Add(encode(2, 3, 0, 0, "", 1, 1, plainChat))
	f.Add(encode(0, 0, 1, 1, "x", 6, 0, "", 0, 0x21, "/v1/models"))
	f.Add(encode(0, 0, 0, 0, "", 1, 1, `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`,
		3, 4|8, "", 4, 0, "data: {\"choices\":[]}\r", 4, 0, "\rdata: [DONE]\r", 4, 1, "\r"))
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{
		{Name: ep1, Models: []string{"m"}}, {Name: ep2, Models: []string{"m"}}, {Name: epName, Models: []string{"m"}},
	}); err != nil {
		f.Fatal(err)
	}
	pk := &orderPicker{order: []string{ep1, ep2, epName}}
	lc, err := route.New(route.Config{Picker: pk, Attempts: 3, Health: &recHealth{}})
	if err != nil {
		f.Fatal(err)
	}
	h := &proxy.Handler{Pool: pool, Lifecycle: lc, Metrics: metrics.New(prometheus.NewRegistry()),
		Logger: slog.New(slog.DiscardHandler), MaxBodyBytes: 4 << 10}
	s := &Server{Handler: func() *proxy.Handler { return h }, Logger: slog.New(slog.DiscardHandler), ChunkBytes: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		ms := &memStream{ctx: context.Background(), in: messages(data)}
		_ = s.Process(ms) // an error status is a clean end too
		for i, r := range ms.out {
			if r.GetImmediateResponse() != nil && i != len(ms.out)-1 {
				t.Fatalf("%d responses after an immediate response", len(ms.out)-1-i)
			}
		}
		for _, ep := range pool.All() {
			if ep.InFlight() != 0 || ep.PendingPrefill() != 0 {
				t.Fatalf("%s left with %d in flight, %d pending prefill", ep.Name, ep.InFlight(), ep.PendingPrefill())
			}
		}
		routed, done := 0, 0
		for _, e := range pk.events() {
			switch e[:4] {
			case "rout":
				routed++
			case "done":
				done++
			}
		}
		if routed != done {
			t.Fatalf("policy told of %d attempts and of the end of %d: %v", routed, done, pk.events())
		}
	})
}

// FuzzEventSplitter cuts a stream into chunks at the offsets the fuzzer picks: every byte is
// passed on, in order, and the events read are those openai.SSEReader reads from the stream
// whole, whatever the line ends ("\n", "\r\n", a lone "\r") and wherever the cuts.
func FuzzEventSplitter(f *testing.F) {
	f.Add([]byte("data: a\n\nevent: x\ndata: b\r\n\r\n: c\n\ndata: [DONE]\n\n"), []byte{3, 9, 1})
	f.Add([]byte("data: a\r\revent: x\rdata: b\rid: 1\r\rdata: [DONE]\r\r"), []byte{8, 1, 1, 5})
	f.Add([]byte("data: a\r\n\r\ndata: b\r\r\n\rdata: c\n\r\n\r"), []byte{9, 1, 9, 1})
	f.Add([]byte("\r\n\r\rdata: a\rb\r\r\ndata"), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		if len(stream) > 1<<16 {
			return
		}
		var want []string
		r := openai.NewSSEReader(bytes.NewReader(stream), maxEvent)
		for range len(stream) + 1 {
			ev, err := r.Next()
			if err != nil {
				break
			}
			want = append(want, fmt.Sprintf("%q %q %q", ev.Name, ev.Data, ev.ID))
		}
		var s eventSplitter
		var got []string
		take := passIf(func(ev openai.Event) bool {
			got = append(got, fmt.Sprintf("%q %q %q", ev.Name, ev.Data, ev.ID))
			return true
		})
		var out []byte
		rest := stream
		for i := 0; len(rest) > 0 || i == 0; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(int(cuts[i]), n)
			}
			out = s.feed(out, rest[:n], n == len(rest), take)
			rest = rest[n:]
		}
		if !bytes.Equal(out, stream) {
			t.Fatalf("passed on %q, want %q", out, stream)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("events (-reader +splitter):\n%s", diff)
		}
	})
}
