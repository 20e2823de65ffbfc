package kernels

import (
	"math"
	"strings"
	"testing"
)

func TestDTypeParseStringRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		s    string
		dt   DType
		size int
	}{{"F32", F32, 4}, {"F16", F16, 2}, {"BF16", BF16, 2}} {
		dt, err := ParseDType(tc.s)
		if err != nil || dt != tc.dt {
			t.Fatalf("ParseDType(%q) = %v, %v", tc.s, dt, err)
		}
		if dt.String() != tc.s || dt.Size() != tc.size {
			t.Fatalf("%v: String %q Size %d", dt, dt.String(), dt.Size())
		}
	}
}

func TestParseDTypeNamesUnsupportedValue(t *testing.T) {
	for _, s := range []string{"I64", "bf16", "F8_E4M3", ""} {
		_, err := ParseDType(s)
		if err == nil || !strings.Contains(err.Error(), `"`+s+`"`) {
			t.Errorf("ParseDType(%q) error = %v, want it to name the value", s, err)
		}
	}
	if got := DType(9).String(); got != "DType(9)" {
		t.Errorf("unknown String = %q", got)
	}
}

func TestMatrixValidate(t *testing.T) {
	cases := []struct {
		name string
		m    Matrix
		want string // "" for valid
	}{
		{"bf16 ok", Matrix{DType: BF16, Rows: 2, Cols: 3, Data: make([]byte, 12)}, ""},
		{"f32 ok", Matrix{DType: F32, Rows: 2, Cols: 3, Data: make([]byte, 24)}, ""},
		{"empty ok", Matrix{DType: F16}, ""},
		{"short", Matrix{DType: F16, Rows: 2, Cols: 3, Data: make([]byte, 11)}, "2x3 F16 matrix needs 12 bytes, has 11"},
		{"long", Matrix{DType: F32, Rows: 1, Cols: 1, Data: make([]byte, 5)}, "needs 4 bytes, has 5"},
		{"negative", Matrix{DType: F32, Rows: -1, Cols: 1}, "negative"},
		{"unknown dtype", Matrix{DType: BF16P + 1, Rows: 1, Cols: 1, Data: make([]byte, 4)}, "unknown dtype"},
		{"overflow", Matrix{DType: F32, Rows: math.MaxInt / 2, Cols: 3}, "overflows"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
