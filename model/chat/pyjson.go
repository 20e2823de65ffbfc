package chat

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// dumpOptions are the json.dumps arguments transformers' tojson takes.
type dumpOptions struct {
	indent       string // "" with hasIndent: newlines only
	hasIndent    bool
	itemSep      string
	keySep       string
	sortKeys     bool
	ensureASCII  bool
	explicitSeps bool
}

// pyDumps writes v as Python's json.dumps(v, ensure_ascii=False) does,
// the tojson filter transformers gives chat templates: ", " and ": "
// separators, objects in insertion order, floats as Python's repr.
func pyDumps(v any, opt dumpOptions) (string, error) {
	if !opt.explicitSeps {
		opt.itemSep, opt.keySep = ", ", ": "
		if opt.hasIndent {
			opt.itemSep = ","
		}
	}
	var b strings.Builder
	if err := dumpTo(&b, v, opt, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func newline(b *strings.Builder, opt dumpOptions, depth int) {
	if opt.hasIndent {
		b.WriteByte('\n')
		for range depth {
			b.WriteString(opt.indent)
		}
	}
}

func dumpTo(b *strings.Builder, v any, opt dumpOptions, depth int) error {
	switch t := v.(type) {
	case *exec.Value:
		if t == nil {
			b.WriteString("null")
			return nil
		}
		if t.IsError() {
			return fmt.Errorf("tojson: %s", t.Error())
		}
		return dumpTo(b, t.Interface(), opt, depth)
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case string:
		quote(b, t, opt.ensureASCII)
	case int:
		b.WriteString(strconv.Itoa(t))
	case float64:
		b.WriteString(pyFloatRepr(t))
	case bigInt:
		b.WriteString(t.digits)
	case exec.Dict:
		return dumpPairs(b, t.Pairs, opt, depth)
	case *exec.Dict:
		if t == nil {
			b.WriteString("null")
			return nil
		}
		return dumpPairs(b, t.Pairs, opt, depth)
	case []any:
		return dumpList(b, len(t), func(i int) any { return t[i] }, opt, depth)
	case pyList:
		return dumpList(b, len(t), func(i int) any { return t[i] }, opt, depth)
	case exec.ValuesList:
		return dumpList(b, len(t), func(i int) any { return t[i] }, opt, depth)
	case map[string]any: // a namespace(), or a map from a filter
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		pairs := make([]*exec.Pair, len(keys))
		for i, k := range keys {
			pairs[i] = &exec.Pair{Key: exec.AsValue(k), Value: exec.ToValue(t[k])}
		}
		return dumpPairs(b, pairs, opt, depth)
	default:
		rv := reflect.ValueOf(v)
		switch rv.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			b.WriteString(strconv.FormatInt(rv.Int(), 10))
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			b.WriteString(strconv.FormatUint(rv.Uint(), 10))
		case reflect.Float32:
			b.WriteString(pyFloatRepr(rv.Float()))
		case reflect.String:
			quote(b, rv.String(), opt.ensureASCII)
		case reflect.Slice, reflect.Array:
			return dumpList(b, rv.Len(), func(i int) any { return rv.Index(i).Interface() }, opt, depth)
		case reflect.Map:
			m := make(map[string]any, rv.Len())
			for it := rv.MapRange(); it.Next(); {
				m[fmt.Sprint(it.Key().Interface())] = it.Value().Interface()
			}
			return dumpTo(b, m, opt, depth)
		default:
			return fmt.Errorf("tojson: Object of type %T is not JSON serializable", v)
		}
	}
	return nil
}

func dumpList(b *strings.Builder, n int, at func(int) any, opt dumpOptions, depth int) error {
	if n == 0 {
		b.WriteString("[]")
		return nil
	}
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteString(opt.itemSep)
		}
		newline(b, opt, depth+1)
		if err := dumpTo(b, at(i), opt, depth+1); err != nil {
			return err
		}
	}
	newline(b, opt, depth)
	b.WriteByte(']')
	return nil
}

func dumpPairs(b *strings.Builder, pairs []*exec.Pair, opt dumpOptions, depth int) error {
	if len(pairs) == 0 {
		b.WriteString("{}")
		return nil
	}
	keys := make([]string, len(pairs))
	for i, p := range pairs {
		k, err := pyKey(p.Key)
		if err != nil {
			return err
		}
		keys[i] = k
	}
	order := make([]int, len(pairs))
	for i := range order {
		order[i] = i
	}
	if opt.sortKeys {
		slices.SortStableFunc(order, func(i, j int) int { return strings.Compare(keys[i], keys[j]) })
	}
	b.WriteByte('{')
	for n, i := range order {
		if n > 0 {
			b.WriteString(opt.itemSep)
		}
		newline(b, opt, depth+1)
		quote(b, keys[i], opt.ensureASCII)
		b.WriteString(opt.keySep)
		if err := dumpTo(b, pairs[i].Value, opt, depth+1); err != nil {
			return err
		}
	}
	newline(b, opt, depth)
	b.WriteByte('}')
	return nil
}

// pyKey is a dict key as json.dumps writes it: strings as they are,
// numbers, booleans and None as their JSON text.
func pyKey(k *exec.Value) (string, error) {
	switch {
	case k == nil || k.IsNil():
		return "null", nil
	case k.IsString():
		return k.String(), nil
	case k.IsBool():
		return strconv.FormatBool(k.Bool()), nil
	case k.IsInteger():
		return strconv.Itoa(k.Integer()), nil
	case k.IsFloat():
		return pyFloatRepr(k.Float()), nil
	}
	return "", fmt.Errorf("tojson: keys must be str, int, float, bool or None, not %T", k.Interface())
}

// quote writes s as a JSON string the way json.dumps does: only '"',
// '\\' and control characters escaped (and, with ensureASCII, everything
// past ASCII as \uXXXX, in UTF-16 surrogate pairs past the BMP).
func quote(b *strings.Builder, s string, ensureASCII bool) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (ensureASCII && r > 0x7e && r < 0x10000):
				b.WriteString(`\u`)
				b.WriteByte(hex[r>>12&0xf])
				b.WriteByte(hex[r>>8&0xf])
				b.WriteByte(hex[r>>4&0xf])
				b.WriteByte(hex[r&0xf])
			case ensureASCII && r >= 0x10000:
				r1, r2 := utf16.EncodeRune(r)
				for _, u := range []rune{r1, r2} {
					b.WriteString(`\u`)
					b.WriteByte(hex[u>>12&0xf])
					b.WriteByte(hex[u>>8&0xf])
					b.WriteByte(hex[u>>4&0xf])
					b.WriteByte(hex[u&0xf])
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// pyFloatRepr formats f as Python's repr(float) does: the shortest
// digits that round-trip, in positional notation for exponents from -4
// to 15 (always with a fractional part) and as d.ddde±XX otherwise.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	mant, expText, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expText)
	digits := strings.Replace(mant, ".", "", 1)
	var out string
	switch {
	case exp < -4 || exp >= 16:
		out = digits[:1]
		if len(digits) > 1 {
			out += "." + digits[1:]
		}
		esign := "+"
		if exp < 0 {
			esign, exp = "-", -exp
		}
		out += fmt.Sprintf("e%s%02d", esign, exp)
	case exp < 0:
		out = "0." + strings.Repeat("0", -exp-1) + digits
	case len(digits) <= exp+1:
		out = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	default:
		out = digits[:exp+1] + "." + digits[exp+1:]
	}
	return sign + out
}
