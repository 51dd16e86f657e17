package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// Kind is the class of a KV-cache event.
type Kind int

const (
	// BlockStored: blocks entered the prefix cache.
	BlockStored Kind = iota + 1
	// BlockRemoved: blocks were evicted from the prefix cache.
	BlockRemoved
	// AllBlocksCleared: the whole prefix cache was dropped (reset, restart).
	AllBlocksCleared
)

// String returns the event class name as vLLM tags it.
func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is one KV-cache event. Fields that do not apply to the kind are zero.
type Event struct {
	Kind Kind
	// BlockHashes are the block hashes stored or removed, in chain order for BlockStored.
	BlockHashes []uint64
	// ParentHash is the hash of the block before BlockHashes[0]; HasParent is false for a chain
	// that starts at the beginning of a prompt.
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the tokens of the stored blocks (empty when the sender has no tokenizer).
	TokenIDs  []int64
	BlockSize int
	// LoraID is -1 when none.
	LoraID int64
	// Medium is "GPU" or "CPU"; "" when unset.
	Medium string
}

// Batch is the events of one engine step.
type Batch struct {
	// TS is the wall-clock time of the batch, in seconds since the Unix epoch.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank of the sender, -1 when not sent.
	DPRank int
}

// Message is one received message: its topic, sequence number and batch.
type Message struct {
	Topic string
	Seq   int64
	Batch Batch
}

// EndOfReplay is the sequence number of the replay socket's end marker.
const EndOfReplay int64 = -1

// EncodeBatch returns the msgpack form of b, in vLLM's array layout.
func EncodeBatch(b Batch) ([]byte, error) {
	// Size the buffer once: a hash takes at most 9 bytes, a token id below 2^32 at most 5.
	size := 16
	for i := range b.Events {
		size += 32 + 9*len(b.Events[i].BlockHashes) + 5*len(b.Events[i].TokenIDs)
	}
	buf := bytes.NewBuffer(make([]byte, 0, size))
	enc := msgpack.NewEncoder(buf)
	n := 2
	if b.DPRank >= 0 {
		n = 3
	}
	errs := []error{enc.EncodeArrayLen(n), enc.EncodeFloat64(b.TS), enc.EncodeArrayLen(len(b.Events))}
	for i := range b.Events {
		errs = append(errs, encodeEvent(enc, &b.Events[i]))
	}
	if n == 3 {
		errs = append(errs, enc.EncodeInt(int64(b.DPRank)))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("encode kv event batch: %w", err)
	}
	return buf.Bytes(), nil
}

func encodeEvent(enc *msgpack.Encoder, ev *Event) error {
	var errs []error
	add := func(err error) {
		if err != nil { // keep the list short: a BlockStored event encodes thousands of token ids
			errs = append(errs, err)
		}
	}
	hashes := func() {
		add(enc.EncodeArrayLen(len(ev.BlockHashes)))
		for _, h := range ev.BlockHashes {
			add(enc.EncodeUint(h))
		}
	}
	medium := func() {
		if ev.Medium == "" {
			add(enc.EncodeNil())
		} else {
			add(enc.EncodeString(ev.Medium))
		}
	}
	switch ev.Kind {
	case BlockStored:
		add(enc.EncodeArrayLen(7))
		add(enc.EncodeString(ev.Kind.String()))
		hashes()
		if ev.HasParent {
			add(enc.EncodeUint(ev.ParentHash))
		} else {
			add(enc.EncodeNil())
		}
		add(enc.EncodeArrayLen(len(ev.TokenIDs)))
		for _, t := range ev.TokenIDs {
			add(enc.EncodeInt(t))
		}
		add(enc.EncodeInt(int64(ev.BlockSize)))
		if ev.LoraID < 0 {
			add(enc.EncodeNil())
		} else {
			add(enc.EncodeInt(ev.LoraID))
		}
		medium()
	case BlockRemoved:
		add(enc.EncodeArrayLen(3))
		add(enc.EncodeString(ev.Kind.String()))
		hashes()
		medium()
	case AllBlocksCleared:
		add(enc.EncodeArrayLen(1))
		add(enc.EncodeString(ev.Kind.String()))
	default:
		return fmt.Errorf("encode kv event: unknown kind %d", int(ev.Kind))
	}
	return errors.Join(errs...)
}

// SeqBytes returns seq as the 8-byte big-endian frame vLLM sends.
func SeqBytes(seq int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(seq))
	return b[:]
}

// ParseSeq reads an 8-byte big-endian sequence frame.
func ParseSeq(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("sequence frame: want 8 bytes, got %d", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// DecodeMessage decodes the frames [topic, seq, payload] of a published message.
func DecodeMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("kv event message: want 3 frames [topic, seq, payload], got %d", len(frames))
	}
	seq, err := ParseSeq(frames[1])
	if err != nil {
		return Message{}, fmt.Errorf("kv event message: %w", err)
	}
	b, err := DecodeBatch(frames[2])
	if err != nil {
		return Message{}, fmt.Errorf("kv event message %d: %w", seq, err)
	}
	return Message{Topic: string(frames[0]), Seq: seq, Batch: b}, nil
}

// DecodeBatch decodes a msgpack event batch in either the array or the map layout.
func DecodeBatch(data []byte) (Batch, error) {
	if err := checkShape(data); err != nil {
		return Batch{}, fmt.Errorf("decode kv event batch: %w", err)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	dec.UseLooseInterfaceDecoding(true)
	v, err := dec.DecodeInterfaceLoose()
	if err != nil {
		return Batch{}, fmt.Errorf("decode kv event batch: %w", err)
	}
	b := Batch{DPRank: -1}
	var ts, events, rank any
	switch t := v.(type) {
	case []any:
		if len(t) < 2 {
			return Batch{}, fmt.Errorf("decode kv event batch: want [ts, events, ...], got %d elements", len(t))
		}
		ts, events = t[0], t[1]
		if len(t) > 2 {
			rank = t[2]
		}
	case map[string]any:
		ts, events, rank = t["ts"], t["events"], t["data_parallel_rank"]
	default:
		return Batch{}, fmt.Errorf("decode kv event batch: want an array or a map, got %T", v)
	}
	if b.TS, err = toFloat(ts); err != nil {
		return Batch{}, fmt.Errorf("decode kv event batch: ts: %w", err)
	}
	if rank != nil {
		r, err := toInt(rank)
		if err != nil {
			return Batch{}, fmt.Errorf("decode kv event batch: data_parallel_rank: %w", err)
		}
		if r < 0 || r > math.MaxInt32 {
			return Batch{}, fmt.Errorf("decode kv event batch: data_parallel_rank %d: want a rank from 0", r)
		}
		b.DPRank = int(r)
	}
	list, ok := events.([]any)
	if !ok {
		return Batch{}, fmt.Errorf("decode kv event batch: events: want a list, got %T", events)
	}
	b.Events = make([]Event, 0, len(list))
	for i, e := range list {
		ev, err := decodeEvent(e)
		if err != nil {
			return Batch{}, fmt.Errorf("decode kv event batch: event %d: %w", i, err)
		}
		b.Events = append(b.Events, ev)
	}
	return b, nil
}

// field names of each event class, in the array layout's order (after the tag).
var fieldOrder = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
	"BlockRemoved":     {"block_hashes", "medium"},
	"AllBlocksCleared": {},
}

func decodeEvent(v any) (Event, error) {
	var tag string
	fields := map[string]any{}
	switch t := v.(type) {
	case []any:
		if len(t) == 0 {
			return Event{}, errors.New("empty event array")
		}
		s, ok := t[0].(string)
		if !ok {
			return Event{}, fmt.Errorf("event tag: want a string, got %T", t[0])
		}
		tag = s
		names, ok := fieldOrder[tag]
		if !ok {
			return Event{}, fmt.Errorf("unknown event type %q", tag)
		}
		for i, name := range names {
			if i+1 < len(t) {
				fields[name] = t[i+1]
			}
		}
	case map[string]any:
		s, ok := t["type"].(string)
		if !ok {
			return Event{}, fmt.Errorf("event map: want a string \"type\", got %T", t["type"])
		}
		tag, fields = s, t
	default:
		return Event{}, fmt.Errorf("want an array or a map, got %T", v)
	}
	ev := Event{LoraID: -1}
	switch tag {
	case "BlockStored":
		ev.Kind = BlockStored
	case "BlockRemoved":
		ev.Kind = BlockRemoved
	case "AllBlocksCleared":
		ev.Kind = AllBlocksCleared
		return ev, nil
	default:
		return Event{}, fmt.Errorf("unknown event type %q", tag)
	}
	var err error
	if ev.BlockHashes, err = toHashes(fields["block_hashes"]); err != nil {
		return Event{}, fmt.Errorf("%s.block_hashes: %w", tag, err)
	}
	if m := fields["medium"]; m != nil {
		s, ok := m.(string)
		if !ok {
			return Event{}, fmt.Errorf("%s.medium: want a string, got %T", tag, m)
		}
		ev.Medium = s
	}
	if ev.Kind == BlockRemoved {
		return ev, nil
	}
	if p := fields["parent_block_hash"]; p != nil {
		if ev.ParentHash, err = toHash(p); err != nil {
			return Event{}, fmt.Errorf("%s.parent_block_hash: %w", tag, err)
		}
		ev.HasParent = true
	}
	if tl := fields["token_ids"]; tl != nil {
		list, ok := tl.([]any)
		if !ok {
			return Event{}, fmt.Errorf("%s.token_ids: want a list, got %T", tag, tl)
		}
		ev.TokenIDs = make([]int64, 0, len(list))
		for _, x := range list {
			n, err := toInt(x)
			if err != nil {
				return Event{}, fmt.Errorf("%s.token_ids: %w", tag, err)
			}
			ev.TokenIDs = append(ev.TokenIDs, n)
		}
	}
	if bs := fields["block_size"]; bs != nil {
		n, err := toInt(bs)
		if err != nil {
			return Event{}, fmt.Errorf("%s.block_size: %w", tag, err)
		}
		ev.BlockSize = int(n)
	}
	if l := fields["lora_id"]; l != nil {
		if ev.LoraID, err = toInt(l); err != nil {
			return Event{}, fmt.Errorf("%s.lora_id: %w", tag, err)
		}
		if ev.LoraID < 0 {
			return Event{}, fmt.Errorf("%s.lora_id: %d is negative: an adapter id is at least 0, or nil for none", tag, ev.LoraID)
		}
	}
	return ev, nil
}

func toHashes(v any) ([]uint64, error) {
	if v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("want a list, got %T", v)
	}
	out := make([]uint64, 0, len(list))
	for _, x := range list {
		h, err := toHash(x)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// toHash reads a block hash: an integer (taken as its 64-bit pattern) or bytes (the last 8
// bytes, big-endian, as vLLM turns a digest into a wire hash).
func toHash(v any) (uint64, error) {
	switch t := v.(type) {
	case int64:
		return uint64(t), nil
	case uint64:
		return t, nil
	case []byte:
		if len(t) == 0 {
			return 0, errors.New("empty hash bytes")
		}
		var b [8]byte
		if len(t) >= 8 {
			copy(b[:], t[len(t)-8:])
		} else {
			copy(b[8-len(t):], t)
		}
		return binary.BigEndian.Uint64(b[:]), nil
	case string:
		return toHash([]byte(t))
	}
	return 0, fmt.Errorf("hash: want an integer or bytes, got %T", v)
}

func toInt(v any) (int64, error) {
	switch t := v.(type) {
	case int64:
		return t, nil
	case uint64:
		if t > math.MaxInt64 {
			return 0, fmt.Errorf("integer %d out of range", t)
		}
		return int64(t), nil
	}
	return 0, fmt.Errorf("want an integer, got %T", v)
}

func toFloat(v any) (float64, error) {
	switch t := v.(type) {
	case float64:
		return t, nil
	case float32:
		return float64(t), nil
	case int64:
		return float64(t), nil
	case uint64:
		return float64(t), nil
	}
	return 0, fmt.Errorf("want a number, got %T", v)
}
