package tokenizer

import (
	"unicode/utf8"
)

// byteToRune and runeToByte are GPT-2's byte-level alphabet: every byte
// gets a printable rune, the printable Latin-1 bytes keep their own code
// point and the rest are shifted to U+0100 and up (tokenizers'
// pre_tokenizers/byte_level.rs bytes_char).
var (
	byteToRune [256]rune
	byteToStr  [256]string
	runeToByte = make(map[rune]byte, 256)
)

func init() {
	keep := func(b int) bool {
		return ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF)
	}
	n := 0
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !keep(b) {
			r = rune(256 + n)
			n++
		}
		byteToRune[b] = r
		byteToStr[b] = string(r)
		runeToByte[r] = byte(b)
	}
}

// byteLevelString maps every byte of s to its byte-level rune.
func byteLevelString(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		n += utf8.RuneLen(byteToRune[s[i]])
	}
	buf := make([]byte, 0, n)
	for i := 0; i < len(s); i++ {
		buf = utf8.AppendRune(buf, byteToRune[s[i]])
	}
	return string(buf)
}

// byteTokenValue reports whether tok is a byte-fallback token "<0xXX>"
// and its byte, with the exact test of tokenizers' ByteFallback decoder.
func byteTokenValue(tok string) (byte, bool) {
	if len(tok) != 6 || tok[0] != '<' || tok[1] != '0' || tok[2] != 'x' || tok[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexDigit(tok[3])
	lo, ok2 := hexDigit(tok[4])
	if !ok1 || !ok2 {
		return 0, false
	}
	return hi<<4 | lo, true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// byteTokenName is the vocabulary entry of a byte-fallback token, as
// Rust's format!("<{b:#04X}>") writes it.
func byteTokenName(b byte) string {
	const hex = "0123456789ABCDEF"
	return string([]byte{'<', '0', 'x', hex[b>>4], hex[b&15], '>'})
}

// appendLossy appends b to dst as Rust's String::from_utf8_lossy does:
// each maximal invalid subpart becomes one U+FFFD (Go's utf8 package
// would give one per byte).
func appendLossy(dst []byte, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, b[i:i+size]...)
			i += size
			continue
		}
		i += invalidPrefixLen(b[i:])
		dst = append(dst, "\uFFFD"...)
	}
	return dst
}

// invalidPrefixLen is the length of the maximal subpart of an invalid
// UTF-8 sequence at the start of b (Unicode 3.9, "U+FFFD substitution of
// maximal subparts"), at least 1.
func invalidPrefixLen(b []byte) int {
	lo, hi := byte(0x80), byte(0xBF)
	var width int
	switch c := b[0]; {
	case 0xC2 <= c && c <= 0xDF:
		width = 2
	case c == 0xE0:
		width, lo = 3, 0xA0
	case c == 0xED:
		width, hi = 3, 0x9F
	case 0xE1 <= c && c <= 0xEF:
		width = 3
	case c == 0xF0:
		width, lo = 4, 0x90
	case c == 0xF4:
		width, hi = 4, 0x8F
	case 0xF1 <= c && c <= 0xF3:
		width = 4
	default:
		return 1
	}
	n := 1
	for ; n < width && n < len(b); n++ {
		c := b[n]
		if n == 1 && (c < lo || c > hi) {
			break
		}
		if n > 1 && (c < 0x80 || c > 0xBF) {
			break
		}
	}
	return n
}
