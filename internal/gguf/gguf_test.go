package gguf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// reader parses a GGUF file back, independently of the writer, for the round-trip tests.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || r.off+n > len(r.b) {
		if r.err == nil {
			r.err = fmt.Errorf("short file at %d (+%d of %d)", r.off, n, len(r.b))
		}
		return make([]byte, max(n, 0))
	}
	out := r.b[r.off : r.off+n]
	r.off += n
	return out
}

func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }
func (r *reader) str() string { return string(r.take(int(r.u64()))) }

func (r *reader) value(typ uint32) any {
	switch typ {
	case typeUint32:
		return r.u32()
	case typeInt32:
		return int32(r.u32())
	case typeFloat32:
		return math.Float32frombits(r.u32())
	case typeBool:
		return r.take(1)[0] == 1
	case typeString:
		return r.str()
	case typeArray:
		et, n := r.u32(), r.u64()
		switch et {
		case typeString:
			out := make([]string, n)
			for i := range out {
				out[i] = r.str()
			}
			return out
		case typeInt32:
			out := make([]int32, n)
			for i := range out {
				out[i] = int32(r.u32())
			}
			return out
		}
	}
	r.err = fmt.Errorf("unknown type %d", typ)
	return nil
}

func parse(t *testing.T, data []byte) *File {
	t.Helper()
	r := &reader{b: data}
	if string(r.take(4)) != "GGUF" || r.u32() != 3 {
		t.Fatal("not a GGUF v3 header")
	}
	nt, nkv := r.u64(), r.u64()
	f := &File{}
	for range nkv {
		k := r.str()
		f.KV = append(f.KV, KV{k, r.value(r.u32())})
	}
	offsets := make([]uint64, nt)
	for i := range nt {
		tn := Tensor{Name: r.str()}
		for range r.u32() {
			tn.Dims = append(tn.Dims, r.u64())
		}
		if typ := r.u32(); typ != typeF32 {
			t.Fatalf("tensor %s: type %d, want f32", tn.Name, typ)
		}
		offsets[i] = r.u64()
		f.Tensors = append(f.Tensors, tn)
	}
	align, err := f.alignment()
	if err != nil {
		t.Fatal(err)
	}
	start := alignUp(uint64(r.off), align)
	for i := range f.Tensors {
		tn := &f.Tensors[i]
		if offsets[i]%align != 0 {
			t.Errorf("tensor %s at offset %d: not aligned to %d", tn.Name, offsets[i], align)
		}
		n := uint64(1)
		for _, d := range tn.Dims {
			n *= d
		}
		r.off = int(start + offsets[i])
		for range n {
			tn.Data = append(tn.Data, math.Float32frombits(r.u32()))
		}
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return f
}

func TestWriteTo_RoundTrip(t *testing.T) {
	f := &File{
		KV: []KV{
			{"general.architecture", "llama"},
			{"general.alignment", uint32(64)},
			{"n", int32(-3)},
			{"eps", float32(1e-5)},
			{"yes", true},
			{"no", false},
			{"tokens", []string{"a", "Ġb", ""}},
			{"types", []int32{1, 3}},
		},
		Tensors: []Tensor{
			{Name: "odd", Dims: []uint64{3}, Data: []float32{1, -2, 0.5}},
			{Name: "m", Dims: []uint64{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}},
		},
	}
	var buf bytes.Buffer
	n, err := f.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) || n%64 != 0 {
		t.Errorf("WriteTo returned %d, wrote %d: want equal, and a multiple of the alignment 64", n, buf.Len())
	}
	if diff := cmp.Diff(f, parse(t, buf.Bytes())); diff != "" {
		t.Errorf("read back (-written +read):\n%s", diff)
	}
}

func TestWriteTo_Refuses(t *testing.T) {
	cases := []struct {
		name string
		f    File
		want []string
	}{
		{"unsupported value", File{KV: []KV{{"x", 1.5}}}, []string{`key "x": unsupported value type float64`}},
		{"duplicate key", File{KV: []KV{{"x", "a"}, {"x", "b"}}}, []string{`key "x": given twice`}},
		{"bad alignment", File{KV: []KV{{"general.alignment", uint32(24)}}}, []string{"general.alignment"}},
		{"dims and data differ", File{Tensors: []Tensor{{Name: "t", Dims: []uint64{2, 2}, Data: []float32{1}}}}, []string{`tensor "t": dims [2 2]`}},
		{"no dims", File{Tensors: []Tensor{{Name: "t"}}}, []string{`tensor "t"`}},
		{"two problems at once", File{KV: []KV{{"x", 1}}, Tensors: []Tensor{{Name: "t", Dims: []uint64{1}}, {Name: "t", Dims: []uint64{1}, Data: []float32{1}}}},
			[]string{`key "x"`, `tensor "t": dims`, `tensor "t": given twice`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := c.f.WriteTo(&buf)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if buf.Len() != 0 {
				t.Errorf("wrote %d bytes of a bad file", buf.Len())
			}
		})
	}
}

type failWriter struct{ after int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.after < len(p) {
		n := max(w.after, 0)
		w.after = 0
		return n, io.ErrShortWrite
	}
	w.after -= len(p)
	return len(p), nil
}

func TestWriteTo_WriterError(t *testing.T) {
	f, err := Llama(LlamaConfig{Embedding: 8, Layers: 1, FeedForward: 8, Heads: 2, KVHeads: 1, Context: 64}, mustVocab(t, []string{"a"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteTo(&failWriter{after: 1000}); err == nil || !strings.Contains(err.Error(), "short write") {
		t.Errorf("err = %v, want the writer's error", err)
	}
}
