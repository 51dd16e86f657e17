package extproc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
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

// messages decodes fuzz input into what a gateway could send: the filter's body modes (the
// first byte's quotient by the modes' count, modulo 4, also bounds the list Envoy is given:
// maxEndpoints, 0 for no bound), then messages, each an opcode, flags and a payload (a body
// chunk, a path, a status, what Envoy says of its answer: report).
func messages(data []byte) (msgs []*extprocv3.ProcessingRequest, maxEndpoints int) {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	modes := []filterv3.ProcessingMode_BodySendMode{fullDuplex, buffered, streamed, noBody, filterv3.ProcessingMode_BUFFERED_PARTIAL}
	req := int(next())
	maxEndpoints = req / len(modes) % 4
	cfg := &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[req%len(modes)], ResponseBodyMode: modes[int(next())%len(modes)]}
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
			}
			m = respHeaders(200+int(flags>>4)*25, "", eos, "content-type", ct)
			report(m, served, payload)
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
	return out, maxEndpoints
}

// fuzzServed are the addresses a report may name as the one that answered: the ranked
// endpoints' (the first choice, the fallbacks), one kvroute never ranked (override_host's
// fallback), one it cannot rank (the named endpoint has no address), and none.
var fuzzServed = []string{"", "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.9.9.9:8000", "engine.local:8000"}

// fuzzFlags are response flags, one per bit of a 16-bit mask: those of Envoy's own answers that
// tell the endpoint's failure, some that tell nobody's (UH, LR, UO, NR, IH, LH: the others of
// their kind read alike), and two that may come with an engine's answer (DI, URX).
var fuzzFlags = []uint64{flagUH, flagUT, flagLR, flagUR, flagUF, flagUC, flagUO, flagNR, flagUPE, flagUMSDR, flagSI, flagDT, flagIH, flagLH, flagDI, flagURX}

// fuzzDetails are response.code_details values, "" for none.
var fuzzDetails = []string{"", "via_upstream", "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}",
	"upstream_per_try_timeout", "response_timeout", "upstream_reset_before_response_started{remote_reset}",
	"upstream_reset_before_response_started{connection_termination}", "no_healthy_upstream", "upstream_reset_before_response_started{overflow}",
	"route_not_found", "local_rate_limited", "upstream_reset_before_response_started{protocol_error}",
	"stream_idle_timeout", "max_duration_timeout", "upstream_max_stream_duration_reached", "request_overall_timeout"}

// report adds to a response headers message what Envoy says of how it came by the answer, as
// payload encodes it (readReport reads it): empty, the address served alone (the metadata's);
// else payload[0] picks the address that answered among fuzzServed (its bit 3: as the
// upstream.address attribute rather than the metadata), payload[1] the attempt count, 0..4
// (0: none; bits 3-4: as x-envoy-attempt-count, the upstream.request_attempt_count attribute
// as a number or as a string, or the header set to the rest of the payload as it came),
// payload[2:4] the response flags (a mask over fuzzFlags), payload[4] the code details
// (fuzzDetails; its bit 4: with a transport failure reason).
func report(m *extprocv3.ProcessingRequest, served, payload string) {
	at := func(i int) byte {
		if i < len(payload) {
			return payload[i]
		}
		return 0
	}
	attrs := map[string]*structpb.Value{}
	if payload != "" {
		served = fuzzServed[int(at(0))%len(fuzzServed)]
		if at(0)&8 != 0 && served != "" {
			attrs["upstream.address"] = structpb.NewStringValue(served)
			served = ""
		}
		hdrs := m.GetResponseHeaders().GetHeaders()
		header := func(v string) {
			hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: "x-envoy-attempt-count", RawValue: []byte(v)})
		}
		switch n := int(at(1)) % 5; (at(1) >> 3) % 4 {
		case 0:
			if n > 0 {
				header(strconv.Itoa(n))
			}
		case 1:
			attrs["upstream.request_attempt_count"] = structpb.NewNumberValue(float64(n))
		case 2:
			attrs["upstream.request_attempt_count"] = structpb.NewStringValue(strconv.Itoa(n))
		case 3:
			header(payload[min(len(payload), 5):])
		}
		var flags uint64
		for i, f := range fuzzFlags {
			if (uint16(at(2))|uint16(at(3))<<8)&(1<<i) != 0 {
				flags |= f
			}
		}
		if flags != 0 {
			attrs["response.flags"] = structpb.NewNumberValue(float64(flags))
		}
		if d := fuzzDetails[int(at(4)&0xf)%len(fuzzDetails)]; d != "" {
			attrs["response.code_details"] = structpb.NewStringValue(d)
		}
		if at(4)&0x10 != 0 {
			attrs["upstream.transport_failure_reason"] = structpb.NewStringValue("delayed connect error: Connection refused")
		}
	}
	if served != "" {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			LBNamespace: {Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(served)}},
		}}
	}
	if len(attrs) > 0 {
		withAttributes(m, attrs)
	}
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
	// A stream request's answer under application/json: its first bytes, a byte order mark, a
	// blank line and the start of a field, held until they say it is events; then a bad event.
	f.Add(encode(0, 0, 0, 0, "", 1, 1, `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`,
		3, 0, "", 4, 0, "\xef\xbb\xbf\nda", 4, 0, "ta: {\"choices\":[]}\n\ndata: {not", 4, 1, " json\n\n"+doneEvent))
	// What Envoy reports (report): the third endpoint served after two attempts, or after one
	// (the second skipped), with a connect failure's flags; an address never ranked after three
	// attempts, on a list of two; the first choice's own timeout, Envoy answering.
	chat := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	f.Add(encode(0, 0, 0, 0, "", 1, 1, chat, 3, 0, "\x03\x02\x00\x00\x00", 4, 1, jsonAnswer))
	f.Add(encode(0, 0, 0, 0, "", 1, 1, chat, 3, 0, "\x0b\x09\x10\x00\x12", 4, 1, jsonAnswer))
	f.Add(encode(5, 1, 0, 0, "", 1, 1, chat, 3, 0x80, "\x04\x03\x00\x00\x00", 4, 1, errorAnswer))
	f.Add(encode(0, 2, 0, 0, "", 1, 1, chat, 3, 0xb0, "\x01\x11\x02\x00\x03", 4, 1, "upstream request timeout"))
	// Envoy's own answer before the pick (its request timeout while the body was coming), and
	// one to a request kvroute never saw; the stream idle timeout at the first choice.
	f.Add(encode(0, 0, 0, 0, "", 1, 0, chat[:9], 3, 0xb0, "\x00\x00\x00\x00\x0f", 4, 1, "request timeout"))
	f.Add(encode(1, 1, 3, 0xa0, "", 4, 1, "forbidden"))
	f.Add(encode(0, 0, 0, 0, "", 1, 1, chat, 3, 0xc0, "\x01\x00\x00\x04\x0c", 4, 1, "stream timeout"))
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{
		{Name: ep1, Models: []string{"m"}}, {Name: ep2, Models: []string{"m"}}, {Name: ep3, Models: []string{"m"}}, {Name: epName, Models: []string{"m"}},
	}); err != nil {
		f.Fatal(err)
	}
	pk := &orderPicker{order: []string{ep1, ep2, ep3, epName}}
	lc, err := route.New(route.Config{Picker: pk, Attempts: 3, Health: &recHealth{}})
	if err != nil {
		f.Fatal(err)
	}
	h := &proxy.Handler{Pool: pool, Lifecycle: lc, Metrics: metrics.New(prometheus.NewRegistry()),
		Logger: slog.New(slog.DiscardHandler), MaxBodyBytes: 4 << 10}
	s := &Server{Handler: func() *proxy.Handler { return h }, Logger: slog.New(slog.DiscardHandler), ChunkBytes: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		in, maxEndpoints := messages(data)
		s.MaxEndpoints = maxEndpoints // one input at a time: Process returns when its stream ends
		ms := &memStream{ctx: context.Background(), in: in}
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
