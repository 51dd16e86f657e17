package kvevents

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	tests := []Batch{
		{TS: 1.5, Events: []Event{}, DPRank: -1},
		{TS: 1700000000.25, DPRank: 0, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{1, 1 << 63, ^uint64(0)}, TokenIDs: []int64{5, 6}, BlockSize: 16, LoraID: -1, Medium: "GPU"},
			{Kind: BlockStored, BlockHashes: []uint64{7}, ParentHash: 1 << 62, HasParent: true, TokenIDs: []int64{}, BlockSize: 16, LoraID: 3},
			{Kind: BlockRemoved, BlockHashes: []uint64{9, 10}, LoraID: -1, Medium: "GPU"},
			{Kind: AllBlocksCleared, LoraID: -1},
		}},
	}
	for _, want := range tests {
		data, err := EncodeBatch(want)
		if err != nil {
			t.Fatalf("EncodeBatch: %v", err)
		}
		got, err := DecodeBatch(data)
		if err != nil {
			t.Fatalf("DecodeBatch: %v", err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	}
}

// The array layout is exactly what vLLM's msgspec array_like tagged structs produce.
func TestEncodeArrayLayout(t *testing.T) {
	data, err := EncodeBatch(Batch{TS: 2, DPRank: -1, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{42}, BlockSize: 16, LoraID: -1, Medium: "GPU"},
		{Kind: BlockRemoved, BlockHashes: []uint64{42}, LoraID: -1, Medium: "GPU"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var got any
	if err := msgpack.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := []any{2.0, []any{
		[]any{"BlockStored", []any{int8(42)}, nil, []any{}, int8(16), nil, "GPU"},
		[]any{"BlockRemoved", []any{int8(42)}, "GPU"},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layout (-want +got):\n%s", diff)
	}
}

func TestDecodeMapLayoutAndExtras(t *testing.T) {
	digest := []byte{0xff, 0xee, 1, 2, 3, 4, 5, 6, 7, 8} // last 8 bytes big-endian
	data, err := msgpack.Marshal(map[string]any{
		"ts": 3,
		"events": []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{digest}, "parent_block_hash": nil,
				"token_ids": []any{1, 2}, "block_size": 16, "lora_id": nil, "medium": "CPU", "lora_name": "x"},
			// array layout with extra trailing fields from a newer sender
			[]any{"BlockRemoved", []any{int64(-1)}, "GPU", "extra", 7},
			[]any{"AllBlocksCleared"},
		},
		"data_parallel_rank": 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBatch(data)
	if err != nil {
		t.Fatal(err)
	}
	want := Batch{TS: 3, DPRank: 2, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{0x0102030405060708}, TokenIDs: []int64{1, 2}, BlockSize: 16, LoraID: -1, Medium: "CPU"},
		{Kind: BlockRemoved, BlockHashes: []uint64{^uint64(0)}, LoraID: -1, Medium: "GPU"},
		{Kind: AllBlocksCleared, LoraID: -1},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decode (-want +got):\n%s", diff)
	}
}

func TestDecodeErrors(t *testing.T) {
	bad := map[string]any{
		"not a batch":   "hello",
		"short array":   []any{1.0},
		"events scalar": []any{1.0, 5},
		"unknown event": []any{1.0, []any{[]any{"BlockMoved"}}},
		"bad hashes":    []any{1.0, []any{[]any{"BlockRemoved", "zz"}}},
		"bad hash item": []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}},
		"map no type":   []any{1.0, []any{map[string]any{"block_hashes": []any{}}}},
		"negative rank": []any{1.0, []any{}, -5},
	}
	for name, v := range bad {
		data, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeBatch(data); err == nil {
			t.Errorf("%s: DecodeBatch succeeded, want an error", name)
		}
	}
	if _, err := DecodeMessage([][]byte{[]byte("t"), {1, 2}, nil}); err == nil {
		t.Error("DecodeMessage with a 2-byte seq succeeded")
	}
}

func FuzzDecodeBatch(f *testing.F) {
	seed, _ := EncodeBatch(Batch{TS: 1, DPRank: 1, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{1, 2}, BlockSize: 16, LoraID: -1},
		{Kind: BlockRemoved, BlockHashes: []uint64{1}, LoraID: -1},
		{Kind: AllBlocksCleared},
	}})
	f.Add(seed)
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeBatch(data)
		if err != nil {
			return
		}
		// What decodes must encode and decode to the same batch.
		again, err := EncodeBatch(b)
		if err != nil {
			t.Fatalf("EncodeBatch of a decoded batch: %v", err)
		}
		b2, err := DecodeBatch(again)
		if err != nil {
			t.Fatalf("DecodeBatch of re-encoded batch: %v", err)
		}
		if diff := cmp.Diff(b, b2, cmpopts.EquateEmpty(), cmpopts.EquateNaNs()); diff != "" {
			t.Errorf("re-encode changed the batch (-first +second):\n%s", diff)
		}
	})
}

func TestDecodeBatchRejectsHostileShapes(t *testing.T) {
	deep := bytes.Repeat([]byte{0x91}, maxDepth+1) // [[[[...]]]] one level too deep
	deep = append(deep, 0xc0)
	for _, tt := range []struct {
		name string
		data []byte
	}{
		{"array32 claiming 4 billion values", []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}},
		{"map32 claiming 4 billion pairs", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdf, 0xff, 0xff, 0xff, 0xff}},
		{"str32 longer than the message", []byte{0xdb, 0, 0, 1, 0, 'a'}},
		{"bin16 cut short", []byte{0xc5, 0}},
		{"nested too deep", deep},
		{"unused type byte", []byte{0xc1}},
		{"bytes after the batch", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0x01}},
		{"empty", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeBatch(tt.data); err == nil {
				t.Errorf("DecodeBatch(% x) accepted it", tt.data)
			}
		})
	}
	// The same shapes nested to the limit, and every layout EncodeBatch writes, pass.
	ok := append(bytes.Repeat([]byte{0x91}, maxDepth-1), 0xc0)
	if err := checkShape(ok); err != nil {
		t.Errorf("nesting of %d: %v", maxDepth, err)
	}
	good, _ := EncodeBatch(Batch{TS: 1, DPRank: 0, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1 << 63, 2}, TokenIDs: []int64{1, 2, 3}, BlockSize: 16, LoraID: -1}}})
	if err := checkShape(good); err != nil {
		t.Errorf("an encoded batch: %v", err)
	}
}
