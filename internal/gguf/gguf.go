package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Value types of the GGUF key-value section.
const (
	typeUint32  = 4
	typeInt32   = 5
	typeFloat32 = 6
	typeBool    = 7
	typeString  = 8
	typeArray   = 9
)

// typeF32 is ggml's tensor type of 32-bit floats; the only one written here (a tiny model
// gains nothing from smaller weights, and f32 needs no conversion code).
const typeF32 = 0

// DefaultAlignment is the alignment of tensor data when general.alignment is not set.
const DefaultAlignment = 32

// KV is one metadata entry. Value is a uint32, int32, float32, bool, string, []string or
// []int32: the types a llama model's metadata needs.
type KV struct {
	Key   string
	Value any
}

// Tensor is one tensor of 32-bit floats. Dims lists the sizes fastest-varying first (ggml's
// ne[0], ne[1], ...): a matrix of Dims {in, out} maps in inputs to out outputs.
type Tensor struct {
	Name string
	Dims []uint64
	Data []float32
}

// File is a whole GGUF file: metadata, then tensors in the order given.
type File struct {
	KV      []KV
	Tensors []Tensor
}

// alignment is general.alignment when set, else DefaultAlignment.
func (f *File) alignment() (uint64, error) {
	for _, kv := range f.KV {
		if kv.Key != "general.alignment" {
			continue
		}
		a, ok := kv.Value.(uint32)
		if !ok || a == 0 || a&(a-1) != 0 {
			return 0, fmt.Errorf("general.alignment: want a uint32 power of two, got %v (%T)", kv.Value, kv.Value)
		}
		return uint64(a), nil
	}
	return DefaultAlignment, nil
}

// check reports every problem that would make the file unreadable, at once.
func (f *File) check() error {
	var errs []error
	keys := map[string]bool{}
	for _, kv := range f.KV {
		if keys[kv.Key] {
			errs = append(errs, fmt.Errorf("key %q: given twice", kv.Key))
		}
		keys[kv.Key] = true
		switch kv.Value.(type) {
		case uint32, int32, float32, bool, string, []string, []int32:
		default:
			errs = append(errs, fmt.Errorf("key %q: unsupported value type %T", kv.Key, kv.Value))
		}
	}
	names := map[string]bool{}
	for _, t := range f.Tensors {
		if names[t.Name] {
			errs = append(errs, fmt.Errorf("tensor %q: given twice", t.Name))
		}
		names[t.Name] = true
		n := uint64(1)
		for _, d := range t.Dims {
			n *= d
		}
		if len(t.Dims) == 0 || len(t.Dims) > 4 || n != uint64(len(t.Data)) {
			errs = append(errs, fmt.Errorf("tensor %q: dims %v (1 to 4 of them) hold %d values, data has %d", t.Name, t.Dims, n, len(t.Data)))
		}
	}
	if _, err := f.alignment(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// WriteTo writes the file to w: header, metadata, tensor descriptions, then each tensor's data
// at an aligned offset. It returns the bytes written. A file that could not be read back (an
// unsupported value type, dims that do not match the data, a name given twice) is an error
// before anything is written.
func (f *File) WriteTo(w io.Writer) (int64, error) {
	if err := f.check(); err != nil {
		return 0, fmt.Errorf("gguf: %w", err)
	}
	align, _ := f.alignment()
	e := &encoder{w: bufio.NewWriterSize(w, 1<<20)}
	e.raw([]byte("GGUF"))
	e.u32(3)
	e.u64(uint64(len(f.Tensors)))
	e.u64(uint64(len(f.KV)))
	for _, kv := range f.KV {
		e.str(kv.Key)
		e.value(kv.Value)
	}
	var off uint64
	for _, t := range f.Tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(typeF32)
		e.u64(off)
		off = alignUp(off+4*uint64(len(t.Data)), align)
	}
	e.pad(align)
	buf := make([]byte, 0, 64<<10)
	for _, t := range f.Tensors {
		for i, v := range t.Data {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			if len(buf) == cap(buf) || i == len(t.Data)-1 {
				e.raw(buf)
				buf = buf[:0]
			}
		}
		e.pad(align)
	}
	if e.err == nil {
		e.err = e.w.Flush()
	}
	if e.err != nil {
		return e.n, fmt.Errorf("gguf: write: %w", e.err)
	}
	return e.n, nil
}

func alignUp(n, align uint64) uint64 { return (n + align - 1) / align * align }

// encoder writes little-endian GGUF primitives, keeping the first error and the byte count.
type encoder struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (e *encoder) raw(b []byte) {
	if e.err != nil {
		return
	}
	k, err := e.w.Write(b)
	e.n += int64(k)
	e.err = err
}

func (e *encoder) u32(v uint32) { e.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (e *encoder) u64(v uint64) { e.raw(binary.LittleEndian.AppendUint64(nil, v)) }

func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	e.raw([]byte(s))
}

func (e *encoder) pad(align uint64) {
	if r := uint64(e.n) % align; r != 0 {
		e.raw(make([]byte, align-r))
	}
}

// value writes a value's type tag and the value; check has vetted the type.
func (e *encoder) value(v any) {
	switch x := v.(type) {
	case uint32:
		e.u32(typeUint32)
		e.u32(x)
	case int32:
		e.u32(typeInt32)
		e.u32(uint32(x))
	case float32:
		e.u32(typeFloat32)
		e.u32(math.Float32bits(x))
	case bool:
		e.u32(typeBool)
		b := byte(0)
		if x {
			b = 1
		}
		e.raw([]byte{b})
	case string:
		e.u32(typeString)
		e.str(x)
	case []string:
		e.u32(typeArray)
		e.u32(typeString)
		e.u64(uint64(len(x)))
		for _, s := range x {
			e.str(s)
		}
	case []int32:
		e.u32(typeArray)
		e.u32(typeInt32)
		e.u64(uint64(len(x)))
		for _, i := range x {
			e.u32(uint32(i))
		}
	}
}
