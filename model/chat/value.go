package chat

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// pyList is a list indexed as Python indexes: l[-n] is l[0] (the
// engine's own lists miss the first element from the end, so that
// "x".split("<think>")[-1] would be None).
type pyList []any

// GetItem returns l[key] for an int key, counting from the end when it
// is negative.
func (l pyList) GetItem(key any) (*exec.Value, bool) {
	i, ok := key.(int)
	if !ok {
		return exec.AsValue(nil), false
	}
	if i < 0 {
		i += len(l)
	}
	if i < 0 || i >= len(l) {
		return exec.AsValue(nil), false
	}
	return exec.ToValue(l[i]), true
}

// bigInt is an integer beyond an int (Python's are unbounded): tojson
// and printing write its digits.
type bigInt struct{ digits string }

func (b bigInt) String() string { return b.digits }

// engineValue converts a template variable into the values the engine
// walks: objects become ordered *exec.Dict, arrays pyList, integers int
// (bigInt past an int) and other numbers float64, as Python's json.loads
// reads them.
//
// json.RawMessage is decoded as DecodeJSON does and Object keeps its
// order; a map[string]any has lost its order already and is walked with
// its keys sorted. A float64 that holds a whole number (from
// encoding/json, which cannot tell 3 from 3.0) is taken for an int, the
// far more common case in JSON schemas and tool arguments.
func engineValue(v any) (any, error) {
	switch t := v.(type) {
	case nil, string, bool, int, bigInt:
		return t, nil
	case json.RawMessage:
		d, err := DecodeJSON(t)
		if err != nil {
			return nil, err
		}
		return engineValue(d)
	case json.Number:
		n, err := number(t)
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", t, err)
		}
		if big, ok := n.(json.Number); ok {
			return bigInt{big.String()}, nil
		}
		return n, nil
	case Object:
		d := &exec.Dict{Pairs: make([]*exec.Pair, 0, len(t))}
		for _, m := range t {
			ev, err := engineValue(m.Value)
			if err != nil {
				return nil, err
			}
			d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(m.Key), Value: exec.AsValue(ev)})
		}
		return d, nil
	case *Object:
		if t == nil {
			return nil, nil
		}
		return engineValue(*t)
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		obj := make(Object, len(keys))
		for i, k := range keys {
			obj[i] = Member{k, t[k]}
		}
		return engineValue(obj)
	case []any:
		out := make(pyList, len(t))
		for i, e := range t {
			ev, err := engineValue(e)
			if err != nil {
				return nil, err
			}
			out[i] = ev
		}
		return out, nil
	case float64:
		return wholeToInt(t), nil
	case float32:
		return wholeToInt(float64(t)), nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if i := rv.Int(); i >= math.MinInt && i <= math.MaxInt {
			return int(i), nil
		}
		return bigInt{strconv.FormatInt(rv.Int(), 10)}, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if u := rv.Uint(); u <= math.MaxInt {
			return int(u), nil
		}
		return bigInt{strconv.FormatUint(rv.Uint(), 10)}, nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Slice, reflect.Array:
		list := make([]any, rv.Len())
		for i := range list {
			list[i] = rv.Index(i).Interface()
		}
		return engineValue(list)
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		m := make(map[string]any, rv.Len())
		for it := rv.MapRange(); it.Next(); {
			m[it.Key().String()] = it.Value().Interface()
		}
		return engineValue(m)
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return nil, nil
		}
		return engineValue(rv.Elem().Interface())
	}
	return v, nil // structs and the like: the engine reads their fields
}

// wholeToInt returns f as an int when it holds an integer exactly.
func wholeToInt(f float64) any {
	if f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
		return int(f)
	}
	return f
}
