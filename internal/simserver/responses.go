package simserver

import (
	"encoding/json"
	"strconv"

	"github.com/kvroute/kvroute/internal/openai"
)

// The Responses API (POST /v1/responses), as far as the router reads it and a client needs it:
// the prompt is the input (a string or items) after the instructions, max_output_tokens
// bounds the answer, and the answer is one assistant message of one output_text part. A
// stream is OpenAI's semantic events, each an "event:" line naming its type and a "data:"
// object with a sequence_number: response.created and response.in_progress at once, the
// message's output_item.added and content_part.added with the first token, one
// output_text.delta per token, then output_text.done, content_part.done, output_item.done and
// the terminal response.completed (or response.incomplete where max_output_tokens cut the
// answer, as OpenAI's API and vLLM's report a length stop), which carries the whole response
// with its usage (input_tokens, output_tokens, input_tokens_details.cached_tokens): there is
// no [DONE]. Responses have no n: one sequence each. Nothing is stored: previous_response_id is
// accepted and echoed, and the conversation it names is not prepended (vLLM answers 404 for one
// it does not hold; here a client's chain still runs, and the router's affinity for it can be
// tried).

// respInfo is what a Responses call echoes in its response object.
type respInfo struct {
	instructions string
	maxOutput    int // max_output_tokens, 0 when absent
	previous     string
	seq          int // stream: the next event's sequence_number
}

// itemID is the id of the call's one output item, a message.
func (c *call) itemID() string { return "msg_" + c.id[len("resp_"):] }

// responseStatus is the status of a finished Responses call, and its incomplete_details.
func (c *call) responseStatus() (string, any) {
	if c.job.finish == "length" { // max_output_tokens reached
		return "incomplete", map[string]string{"reason": "max_output_tokens"}
	}
	return "completed", nil
}

// responseObject is the call's response object: status in_progress (no output, usage null)
// until done, then its output message of produced tokens and its usage.
func (c *call) responseObject(done bool, produced, cached int) map[string]any {
	status, incomplete := "in_progress", any(nil)
	output := []any{}
	var usage any
	if done {
		status, incomplete = c.responseStatus()
		output = append(output, c.outputItem(status, string(appendText(nil, c.textBase, 0, produced))))
		usage = map[string]any{
			"input_tokens":          c.promptTokens,
			"input_tokens_details":  map[string]int{"cached_tokens": cached},
			"output_tokens":         produced,
			"output_tokens_details": map[string]int{"reasoning_tokens": 0},
			"total_tokens":          c.promptTokens + produced,
		}
	}
	nullable := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	var maxOutput any
	if c.resp.maxOutput > 0 {
		maxOutput = c.resp.maxOutput
	}
	return map[string]any{
		"id": c.id, "object": "response", "created_at": c.created, "status": status,
		"error": nil, "incomplete_details": incomplete, "instructions": nullable(c.resp.instructions),
		"max_output_tokens": maxOutput, "model": json.RawMessage(c.model), "output": output,
		"parallel_tool_calls": true, "previous_response_id": nullable(c.resp.previous),
		"store": false, "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto", "tools": []any{},
		"truncation": "disabled", "usage": usage,
	}
}

// outputItem is the call's output message, of status (completed, incomplete or in_progress),
// holding text.
func (c *call) outputItem(status, text string) map[string]any {
	content := []any{}
	if status != "in_progress" {
		content = append(content, outputText(text))
	}
	return map[string]any{"type": "message", "id": c.itemID(), "status": status, "role": "assistant", "content": content}
}

func outputText(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
}

// appendEvent appends the stream event typ with the members of data, its type and
// sequence_number added.
func (c *call) appendEvent(dst []byte, typ string, data map[string]any) []byte {
	data["type"], data["sequence_number"] = typ, c.resp.seq
	c.resp.seq++
	b, err := json.Marshal(data)
	if err != nil { // cannot happen: strings, numbers, maps and raw JSON that was marshalled
		panic(err)
	}
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	dst = append(dst, "\ndata: "...)
	dst = append(dst, b...)
	return append(dst, "\n\n"...)
}

// appendResponseStart appends the events that open a Responses stream.
func (c *call) appendResponseStart(dst []byte) []byte {
	dst = c.appendEvent(dst, "response.created", map[string]any{"response": c.responseObject(false, 0, 0)})
	return c.appendEvent(dst, "response.in_progress", map[string]any{"response": c.responseObject(false, 0, 0)})
}

// appendItemOpened appends the events that open the output message, before its first token.
func (c *call) appendItemOpened(dst []byte) []byte {
	dst = c.appendEvent(dst, "response.output_item.added", map[string]any{"output_index": 0, "item": c.outputItem("in_progress", "")})
	return c.appendEvent(dst, "response.content_part.added", map[string]any{
		"item_id": c.itemID(), "output_index": 0, "content_index": 0, "part": outputText("")})
}

// appendDelta appends the output_text.delta event of output token i: written by hand, one per
// token, as the chat chunks are.
func (c *call) appendDelta(dst []byte, i int) []byte {
	dst = append(dst, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":"...)
	dst = strconv.AppendInt(dst, int64(c.resp.seq), 10)
	c.resp.seq++
	dst = append(dst, `,"item_id":"`...)
	dst = append(dst, c.itemID()...)
	dst = append(dst, `","output_index":0,"content_index":0,"delta":"`...)
	dst = append(dst, token(c.textBase, i)...)
	return append(dst, "\",\"logprobs\":[]}\n\n"...)
}

// appendResponseEnd appends the events that close a Responses stream of p.produced tokens:
// the text, the part and the item done, then the terminal event with the whole response.
func (c *call) appendResponseEnd(dst []byte, p progress) []byte {
	if c.sent == 0 { // no token came: the item was never opened
		dst = c.appendItemOpened(dst)
	}
	status, _ := c.responseStatus()
	text := string(appendText(nil, c.textBase, 0, p.produced))
	dst = c.appendEvent(dst, "response.output_text.done", map[string]any{
		"item_id": c.itemID(), "output_index": 0, "content_index": 0, "text": text, "logprobs": []any{}})
	dst = c.appendEvent(dst, "response.content_part.done", map[string]any{
		"item_id": c.itemID(), "output_index": 0, "content_index": 0, "part": outputText(text)})
	dst = c.appendEvent(dst, "response.output_item.done", map[string]any{"output_index": 0, "item": c.outputItem(status, text)})
	return c.appendEvent(dst, "response."+status, map[string]any{"response": c.responseObject(true, p.produced, p.cached)})
}

// newRespInfo is the Responses part of a call of req.
func newRespInfo(req *openai.Request) *respInfo {
	return &respInfo{instructions: req.Instructions, maxOutput: req.MaxTokens, previous: req.PreviousResponseID}
}
