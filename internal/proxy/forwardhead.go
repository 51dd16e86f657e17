package proxy

import (
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
)

// Bounds of the client's header fields the router forwards to the engines (forwardedHead).
// The engines' servers refuse heads past theirs: uvicorn's h11 (vLLM, SGLang) a head of more
// than 16 KiB by default, hyper (TGI) and Envoy more than 100 fields. A client's head within
// what the API server reads (1 MiB) but past those went to the engine whole (the QA's 900 KB
// header and 10,004 headers arrived intact), to be refused there as the endpoint's refusal, or
// to cost it the parsing. The fields bound leaves room under 100 for what the router adds
// (Host, Content-Length, Content-Type, X-Request-Id, X-Kvroute-Via, User-Agent) and a proxy
// before the engine may.
const (
	maxForwardedFields = 64
	maxForwardedBytes  = 16 << 10
)

// forwardedHead refuses a request whose header fields that the router forwards to the engine
// are more than maxForwardedFields, or more than maxForwardedBytes as written on the wire
// ("Name: value\r\n"): 431, as the engine would answer (RFC 6585, 5), rather than an engine's
// refusal counted against its endpoint. The fields the router removes or replaces are not
// counted (hop-by-hop ones and those the Connection field names, forwarding ones, the body's,
// the request id; the API key where tenants are on: tenants).
func forwardedHead(hdr http.Header, tenants bool) *openai.Error {
	var hop map[string]bool // the fields the Connection field names, removed (removeHopByHop)
	for _, f := range hdr["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				if hop == nil {
					hop = map[string]bool{}
				}
				hop[textproto.CanonicalMIMEHeaderKey(sf)] = true
			}
		}
	}
	fields, size := 0, 0
	for k, vv := range hdr {
		if hop[k] {
			continue
		}
		switch k {
		case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer",
			"Transfer-Encoding", "Upgrade", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
			"Content-Encoding", "Content-Length", "Content-Type", "Accept-Encoding", "X-Request-Id":
			continue
		case "Authorization", "Api-Key":
			if tenants {
				continue
			}
		}
		for _, v := range vv {
			fields++
			size += len(k) + len(v) + 4
		}
	}
	if fields <= maxForwardedFields && size <= maxForwardedBytes {
		return nil
	}
	return openai.NewError(http.StatusRequestHeaderFieldsTooLarge, openai.TypeInvalidRequest, "", "request_header_fields_too_large",
		"the request's header fields are too large to forward to an engine: "+strconv.Itoa(fields)+" fields of "+strconv.Itoa(size)+
			" bytes, where the router forwards at most "+strconv.Itoa(maxForwardedFields)+" fields and "+strconv.Itoa(maxForwardedBytes)+
			" bytes (engines' servers refuse larger heads); send fewer or shorter headers")
}
