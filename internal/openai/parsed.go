package openai

import "context"

// Parsed is a request body read and parsed once already (by the tenant gate, which counts a
// request's tokens before admitting it), passed on in the request's context so that the proxy
// does not read and parse it again.
type Parsed struct {
	Kind Kind
	Body []byte
	Req  *Request
}

type parsedKey struct{}

// WithParsed returns ctx carrying p.
func WithParsed(ctx context.Context, p *Parsed) context.Context {
	return context.WithValue(ctx, parsedKey{}, p)
}

// ParsedFrom returns the body parsed earlier in the request's way, or nil.
func ParsedFrom(ctx context.Context) *Parsed {
	p, _ := ctx.Value(parsedKey{}).(*Parsed)
	return p
}
