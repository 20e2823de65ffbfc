package grammar

import (
	"fmt"
	"math/big"
	"strings"
)

// bounds bound a number's value as a schema's minimum, maximum,
// exclusiveMinimum and exclusiveMaximum do (lo and hi nil: none), and an
// integer's multipleOf. A bounded number is written without an exponent,
// and the grammar takes a digit only where a number within the bounds
// can still follow: the text so far is worked out exactly (big.Rat), as
// the intervals of the numbers that begin with it.
type bounds struct {
	lo, hi         *big.Rat
	loExcl, hiExcl bool
	multiple       *big.Int // integers only; nil: any
}

// interval is a set of reals between lo and hi (nil: unbounded on that
// side), each end open or closed.
type interval struct {
	lo, hi         *big.Rat
	loOpen, hiOpen bool
}

// meet is the intersection of a and b's bounds.
func (b *bounds) meet(a interval) interval {
	if b.lo != nil && (a.lo == nil || b.lo.Cmp(a.lo) > 0 || b.lo.Cmp(a.lo) == 0 && b.loExcl) {
		a.lo, a.loOpen = b.lo, b.loExcl
	}
	if b.hi != nil && (a.hi == nil || b.hi.Cmp(a.hi) < 0 || b.hi.Cmp(a.hi) == 0 && b.hiExcl) {
		a.hi, a.hiOpen = b.hi, b.hiExcl
	}
	return a
}

// holdsReal reports whether a holds a real number.
func (a interval) holdsReal() bool {
	if a.lo == nil || a.hi == nil {
		return true
	}
	c := a.lo.Cmp(a.hi)
	return c < 0 || c == 0 && !a.loOpen && !a.hiOpen
}

// holdsInteger reports whether a holds an integer (a multiple of m, when
// m is set).
func (a interval) holdsInteger(m *big.Int) bool {
	if m == nil {
		m = big.NewInt(1)
	}
	// the least multiple of m at or past lo, against hi
	if a.lo == nil || a.hi == nil {
		return true
	}
	q := new(big.Rat).Quo(a.lo, new(big.Rat).SetInt(m))
	k := ceil(q)
	if a.loOpen && new(big.Rat).SetInt(new(big.Int).Mul(k, m)).Cmp(a.lo) == 0 {
		k.Add(k, big.NewInt(1))
	}
	least := new(big.Rat).SetInt(k.Mul(k, m))
	c := least.Cmp(a.hi)
	return c < 0 || c == 0 && !a.hiOpen
}

// ceil is the least integer at or above q.
func ceil(q *big.Rat) *big.Int {
	n, d := q.Num(), q.Denom()
	z, r := new(big.Int).QuoRem(n, d, new(big.Int))
	if r.Sign() > 0 {
		z.Add(z, big.NewInt(1))
	}
	return z
}

// admits reports whether text, a whole number, is within b (nil: any).
func (b *bounds) admits(text string, integer bool) bool {
	if b == nil {
		return true
	}
	v, ok := new(big.Rat).SetString(text)
	if !ok {
		return false
	}
	in := b.meet(interval{lo: v, hi: v})
	if integer {
		return in.holdsInteger(b.multiple)
	}
	return in.holdsReal()
}

// pow10 is 10^k, read only.
func pow10(k int) *big.Rat { return powers[k] }

// powers are 10^0 .. 10^(maxIntDigits+maxFracDigits).
var powers = func() []*big.Rat {
	ps := make([]*big.Rat, maxIntDigits+maxFracDigits+1)
	for k := range ps {
		ps[k] = new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(k)), nil))
	}
	return ps
}()

// reachable reports whether a number within b begins with text, the
// bytes so far of a number in state st: whether one of the intervals of
// the magnitudes that begin with text, signed, meets the bounds.
func (b *bounds) reachable(text string, st uint8, integer bool) bool {
	neg := strings.HasPrefix(text, "-")
	digits := strings.TrimPrefix(text, "-")
	whole, frac, dotted := strings.Cut(digits, ".")
	// meets reports whether magnitudes s (signed) hold a number within
	// b, and past reports whether s lies wholly beyond b's bound on its
	// side (so do larger magnitudes)
	meets := func(s interval) (ok, past bool) {
		if neg {
			s = interval{lo: new(big.Rat).Neg(s.hi), hi: new(big.Rat).Neg(s.lo), loOpen: s.hiOpen, hiOpen: s.loOpen}
		}
		in := b.meet(s)
		if integer && in.holdsInteger(b.multiple) || !integer && in.holdsReal() {
			return true, false
		}
		return false, !neg && b.hi != nil && s.lo.Cmp(b.hi) > 0 || neg && b.lo != nil && s.hi.Cmp(b.lo) < 0
	}
	switch {
	case whole == "": // only the sign
		ok, _ := meets(interval{lo: new(big.Rat), hi: pow10(maxIntDigits), hiOpen: true})
		return ok
	case dotted:
		at, _ := new(big.Rat).SetString(whole + "." + frac + "0")
		if len(frac) >= maxFracDigits {
			ok, _ := meets(interval{lo: at, hi: at})
			return ok
		}
		ok, _ := meets(interval{lo: at, hi: new(big.Rat).Add(at, new(big.Rat).Inv(pow10(len(frac)))), hiOpen: true})
		return ok
	}
	v, _ := new(big.Rat).SetString(whole)
	more := maxIntDigits - len(whole) // digits that may follow
	if st == numZero {
		more = 0
	}
	next := new(big.Rat).Add(v, big.NewRat(1, 1))
	for k := 0; k <= more; k++ {
		s := interval{lo: new(big.Rat).Mul(v, pow10(k)), hi: new(big.Rat).Mul(next, pow10(k)), hiOpen: true}
		if k == 0 && integer {
			s = interval{lo: v, hi: v} // the number ends here, or goes on to k > 0
		}
		ok, past := meets(s)
		if ok {
			return true
		}
		if past {
			return false
		}
	}
	return false
}

// onGrid moves b's bounds inward onto the numbers a grammar can write,
// those of at most maxFracDigits fraction digits, each bound inclusive
// after: a bound finer than that would leave numbers it allows that no
// text can be, and a walk that could reach none of them.
func (b *bounds) onGrid() {
	grid := pow10(maxFracDigits)
	if b.lo != nil {
		n := new(big.Rat).Mul(b.lo, grid)
		k := ceil(n)
		if b.loExcl && new(big.Rat).SetInt(k).Cmp(n) == 0 {
			k.Add(k, big.NewInt(1))
		}
		b.lo, b.loExcl = new(big.Rat).Quo(new(big.Rat).SetInt(k), grid), false
	}
	if b.hi != nil {
		n := new(big.Rat).Mul(b.hi, grid)
		k := new(big.Int).Neg(ceil(new(big.Rat).Neg(n))) // floor
		if b.hiExcl && new(big.Rat).SetInt(k).Cmp(n) == 0 {
			k.Sub(k, big.NewInt(1))
		}
		b.hi, b.hiExcl = new(big.Rat).Quo(new(big.Rat).SetInt(k), grid), false
	}
}

// numberBounds reads a schema's bounds on a number: minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (numbers, as JSON Schema 2020-12
// writes them) and, for integers, multipleOf (a positive integer). It is
// nil when there are none, and an error names a bound that is not a
// number or leaves no number.
func numberBounds(fields map[string]*value, integer bool, path string) (*bounds, error) {
	var b bounds
	any := false
	for _, k := range []struct {
		name string
		to   **big.Rat
		excl *bool
		is   bool
	}{{"minimum", &b.lo, &b.loExcl, false}, {"exclusiveMinimum", &b.lo, &b.loExcl, true},
		{"maximum", &b.hi, &b.hiExcl, false}, {"exclusiveMaximum", &b.hi, &b.hiExcl, true}} {
		v, ok := fields[k.name]
		if !ok {
			continue
		}
		r, ok := new(big.Rat).SetString(v.text)
		if v.kind != vNumber || !ok {
			return nil, fmt.Errorf("%s/%s: must be a number", path, k.name)
		}
		if limit := pow10(maxIntDigits - 1); new(big.Rat).Abs(r).Cmp(limit) >= 0 {
			return nil, fmt.Errorf("%s/%s: %s is past the %d digits a number here may have", path, k.name, v.text, maxIntDigits-1)
		}
		any = true
		// of a bound and its exclusive form, the narrower holds
		tighter := *k.to == nil
		if !tighter {
			c := r.Cmp(*k.to)
			if k.to == &b.lo {
				tighter = c > 0 || c == 0 && k.is
			} else {
				tighter = c < 0 || c == 0 && k.is
			}
		}
		if tighter {
			*k.to, *k.excl = r, k.is
		}
	}
	if v, ok := fields["multipleOf"]; ok {
		m, ok := new(big.Int).SetString(v.text, 10)
		if !integer || v.kind != vNumber || !ok || m.Sign() <= 0 {
			return nil, fmt.Errorf("%s/multipleOf: only a positive integer multipleOf of an integer is supported", path)
		}
		b.multiple, any = m, true
	}
	if !any {
		return nil, nil
	}
	if !integer {
		b.onGrid()
	}
	all := b.meet(interval{})
	if integer && !all.holdsInteger(b.multiple) || !integer && !all.holdsReal() {
		return nil, fmt.Errorf("%s: no number is within its bounds", path)
	}
	return &b, nil
}
