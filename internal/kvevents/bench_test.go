package kvevents

import "testing"

// benchBatch is one busy engine step: a 2000-token prompt stored (125 blocks of 16) and as
// many evicted.
func benchBatch() Batch {
	hashes := make([]uint64, 125)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	return Batch{TS: 1.7e9, DPRank: -1, Events: []Event{
		{Kind: BlockStored, BlockHashes: hashes, ParentHash: 7, HasParent: true, TokenIDs: []int64{}, BlockSize: 16, LoraID: -1, Medium: "GPU"},
		{Kind: BlockRemoved, BlockHashes: hashes, LoraID: -1, Medium: "GPU"},
	}}
}

func BenchmarkEncodeBatch(b *testing.B) {
	batch := benchBatch()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeBatch(batch); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeBatch(b *testing.B) {
	data, err := EncodeBatch(benchBatch())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeBatch(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeBatchTokenIDs is BenchmarkEncodeBatch with the token ids of the stored blocks
// (2000 of them), as the simulator and vLLM send them.
func BenchmarkEncodeBatchTokenIDs(b *testing.B) {
	batch := benchBatch()
	ids := make([]int64, 125*16)
	for i := range ids {
		ids[i] = int64(i*7919) % 128256
	}
	batch.Events[0].TokenIDs = ids
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeBatch(batch); err != nil {
			b.Fatal(err)
		}
	}
}
