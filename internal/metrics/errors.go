package metrics

import "slices"

// OtherError is the error_type or error_code label of kvroute_request_errors_total for a value
// that is none of ErrorTypes or ErrorCodes: in practice an engine's own error type or code,
// relayed with its error answer (vLLM's "BadRequestError", say). Engines may send any text
// there; counted as it came, it would make a series for each.
const OtherError = "other"

// ErrorTypes are the access line's error_type values the router's code writes (internal/proxy,
// internal/extproc, internal/tenant, internal/openai): the OpenAI error types of its own
// answers, and the names it gives what ended a request after its head went out.
// TestErrorLabelsListed reads that code for the values it sets and finds each here.
var ErrorTypes = []string{
	// OpenAI error types of the router's own error answers.
	"invalid_request_error", "not_found_error", "service_unavailable_error", "upstream_error", "server_error",
	"rate_limit_error",
	// A tenant's limits (429): requests or tokens per minute, concurrency.
	"requests", "tokens",
	// Ends after the head: the engine's stream, or the client.
	"stream_bad_event", "stream_cut", "stream_error", "stream_idle_timeout", "stream_event_too_large",
	"client_write_stall", "client_gone",
	// ext_proc: the gateway's messages out of order.
	"ext_proc_protocol_error",
}

// ErrorCodes are the access line's error_code values the router's code writes, as ErrorTypes.
var ErrorCodes = []string{
	"", // none: the access line has no error_code
	// The engine failed the request.
	"upstream_bad_answer", "upstream_connection_lost", "upstream_timeout", "upstream_unreachable",
	"upstream_answer_cut", "stream_cut", "max_stream_duration",
	// The router refused or shed it.
	"no_healthy_endpoint", "overloaded", "shutting_down", "rate_limited", "routing_loop",
	"model_not_found", "unknown_url", "method_not_allowed", "unsupported_content_encoding",
	"request_too_large", "request_header_fields_too_large", "request_timeout",
	"integer_above_max_value", "integer_below_min_value", "invalid_type",
	// The client left.
	"client_closed_request", "client_gone",
	// A tenant's key or limits.
	"missing_api_key", "invalid_api_key", "multiple_api_keys", "rate_limit_exceeded", "concurrency_limit_exceeded",
	// ext_proc.
	"ext_proc_protocol_error", "ext_proc_misconfigured",
}

// An error_type and error_code made at 0 (endpointErrors, refusalErrors).
type errorLabels struct{ Type, Code string }

// endpointErrors are made at 0 for every endpoint and model it serves: the engine failures
// that kvroute_requests_total counts as one 502 (a stream's bad event, its cut, its error
// event; an answer no client can read, a connection lost before the answer), whose first
// occurrence on an endpoint an alert must see. The others come at their first occurrence,
// as the statuses outside endpointStatuses do. These five cost: with 500 endpoints listing 20
// models, 50,084 series and 6.8 MB of a /metrics of 12.2 MB, idle (without them, 5.4 MB);
// every pair of the lists would cost hundreds of series per endpoint and model.
var endpointErrors = []errorLabels{
	{"stream_bad_event", "upstream_bad_answer"},
	{"stream_cut", ""},
	{"stream_error", ""},
	{"upstream_error", "upstream_bad_answer"},
	{"upstream_error", "upstream_connection_lost"},
}

// refusalErrors are made at 0 with endpoint "none" for every model label: the causes of the
// router's own 503 (no healthy endpoint, overloaded, shutting down) and 502 (no endpoint
// reachable), which kvroute_requests_total counts under one status each.
var refusalErrors = []errorLabels{
	{"service_unavailable_error", "no_healthy_endpoint"},
	{"service_unavailable_error", "overloaded"},
	{"service_unavailable_error", "shutting_down"},
	{"upstream_error", "upstream_unreachable"},
}

// RequestError counts a request of model settled on endpoint (as kvroute_requests_total names
// them) whose access line says errType and errCode: a value outside ErrorTypes or ErrorCodes
// is counted as OtherError. A request without an error type is not counted.
func (m *Metrics) RequestError(model, endpoint, errType, errCode string) {
	if errType == "" {
		return
	}
	if !slices.Contains(ErrorTypes, errType) {
		errType = OtherError
	}
	if !slices.Contains(ErrorCodes, errCode) {
		errCode = OtherError
	}
	m.RequestErrors.WithLabelValues(model, endpoint, errType, errCode).Inc()
}
